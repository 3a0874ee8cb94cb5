#!/usr/bin/env python3
"""Trains lode-mini on the GPU machine: a byte-level BPE tokenizer (HF tokenizers, Qwen3.5's
pre-split regex), then a small qwen3_5_moe model (transformers) with one MTP block trained on an
auxiliary next-next-token loss, then evaluates it and writes a checkpoint lode convert reads.

    python3 tools/mini/train.py --corpus DIR --out DIR [--train-seconds S] [--smoke]

DIR (corpus): what tools/mini/corpus.py writes (train.jsonl, heldout.jsonl, heldout.txt,
needles_train.jsonl, needles_eval_{1k,4k,16k}.jsonl, chat_train.jsonl).
OUT: tokenizer.json, config.json, model-0000N-of-0000M.safetensors + index (bf16), metrics.json
(training curve, held-out perplexity with lode ppl's window definition, unigram baseline, samples,
needle accuracy, per-layer expert usage, MTP draft acceptance). See tools/mini/README.md.
"""
import argparse
import copy
import json
import math
import pathlib
import random
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

QWEN35_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
                r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # control tokens (special: true)
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB = 8192
SEQ = 1024          # training context; lode ppl's default window is the same
PPL_CTX = 1024


def log(*args):
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------------------------------
# Tokenizer

def train_tokenizer(texts, out_path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(ADDED), min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(str(out_path))
    return tok


def render_chat(messages):
    """ChatML as Qwen3.5's template renders the last turn (reasoning kept, think block always)."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            reasoning = (m.get("reasoning_content") or "").strip()
            out.append(f"<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{m['content'].strip()}<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{m['role']}\n{m['content'].strip()}<|im_end|>\n")
    return "".join(out)


def token_stream(tok, texts, eot):
    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int32)


# ------------------------------------------------------------------------------------------------
# Model

def make_config(max_positions):
    import transformers as tf
    layers = 8
    return tf.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256,
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=64, shared_expert_intermediate_size=128,
        num_experts=16, num_experts_per_tok=4, router_aux_loss_coef=0.001,
        max_position_embeddings=max_positions, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        tie_word_embeddings=False,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        bos_token_id=None, eos_token_id=2, pad_token_id=None)


class Mtp(nn.Module):
    """Qwen3.5's MTP block (shared/spec/qwen35moe.md): u = fc([enorm(embed(x_{t+1})), hnorm(h_t)]),
    one full-attention + MoE decoder layer, norm; the main lm_head turns it into logits for t+2.
    Parameter names follow the released checkpoints (mtp.fc, mtp.pre_fc_norm_embedding, ...)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"]
        layer_config.num_hidden_layers = 1
        h = config.hidden_size
        self.pre_fc_norm_embedding = m.Qwen3_5MoeRMSNorm(h, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = m.Qwen3_5MoeRMSNorm(h, eps=config.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([m.Qwen3_5MoeDecoderLayer(layer_config, 0)])
        self.norm = m.Qwen3_5MoeRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, model, next_embeds, hidden, first_position):
        b, t, _ = hidden.shape
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        positions = torch.arange(first_position, first_position + t, device=u.device)
        rope = model.model.rotary_emb(u, positions.view(1, 1, -1).expand(3, b, -1))
        causal = torch.full((t, t), float("-inf"), device=u.device).triu(1)
        mask = causal.to(u.dtype)[None, None].expand(b, 1, t, t)
        u = self.layers[0](u, position_embeddings=rope, attention_mask=mask, position_ids=positions.view(1, -1))
        if isinstance(u, tuple):
            u = u[0]
        return self.norm(u)


def init_weights(model, mtp):
    # transformers' init gives zero-centred norms ((1 + w)) already; keep it, and the MTP norms too.
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if name.endswith("norm.weight"):
                p.zero_()


def forward_losses(model, mtp, x, y1, y2, want_aux=True):
    """x [B, T]; y1 = next tokens [B, T]; y2 = next-next tokens [B, T-1]."""
    out = model.model(input_ids=x, output_router_logits=want_aux)
    h = out.last_hidden_state
    logits = model.lm_head(h).float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y1.reshape(-1))
    u = mtp(model, model.model.embed_tokens(x[:, 1:]), h[:, :-1], 1)
    logits2 = model.lm_head(u).float()
    mtp_loss = F.cross_entropy(logits2.reshape(-1, logits2.shape[-1]), y2.reshape(-1))
    aux = torch.zeros((), device=x.device)
    router_logits = getattr(out, "router_logits", None)
    if want_aux and router_logits:
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import load_balancing_loss_func
        aux = load_balancing_loss_func(router_logits, model.config.num_experts, model.config.num_experts_per_tok)
    return loss, mtp_loss, aux


def choose_kernels(model, mtp, device, metrics):
    """sdpa attention; grouped_mm experts when a forward+backward under bf16 autocast works with
    them, else transformers' default experts loop."""
    def set_impl(module, setter, value):
        try:
            getattr(module, setter)(value)
            return True
        except Exception as e:  # noqa: BLE001
            metrics["errors"].append(f"{setter}({value}): {e}")
            return False

    set_impl(model, "set_attn_implementation", "sdpa")
    mtp.layers[0].self_attn.config._attn_implementation = model.config._attn_implementation
    x = torch.randint(0, VOCAB, (2, 66), device=device)
    for experts in ("grouped_mm", None):
        if experts and not set_impl(model, "set_experts_implementation", experts):
            continue
        if experts is None:
            set_impl(model, "set_experts_implementation", "eager")
        if experts:
            for mod in mtp.modules():
                if hasattr(mod, "config") and mod is not mtp:
                    mod.config._experts_implementation = model.config._experts_implementation
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, mtp_loss, aux = forward_losses(model, mtp, x[:, :64], x[:, 1:65], x[:, 2:65])
            (loss + mtp_loss + aux).backward()
            model.zero_grad(set_to_none=True)
            mtp.zero_grad(set_to_none=True)
            metrics["kernels"] = {"attention": model.config._attn_implementation, "experts": experts or "default"}
            log("kernels:", metrics["kernels"])
            return
        except Exception:  # noqa: BLE001
            metrics["errors"].append(f"probe with experts={experts}: {traceback.format_exc()}")
            log(f"probe with experts={experts} failed:\n{traceback.format_exc()}")
    raise RuntimeError("no working kernel choice (see metrics errors)")


# ------------------------------------------------------------------------------------------------
# Training

def batches(stream, batch, seq, gen):
    n = stream.numel() - seq - 2
    starts = torch.randint(0, n, (batch,), generator=gen)
    w = torch.stack([stream[s:s + seq + 2] for s in starts.tolist()]).long()
    return w[:, :seq], w[:, 1:seq + 1], w[:, 2:seq + 1]


def train(model, mtp, pre_stream, chat_stream, args, device):
    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator().manual_seed(1234)
    curve = []
    start = time.time()
    step, tokens = 0, 0
    chat_from = 1.0 - args.chat_fraction
    while True:
        frac = (time.time() - start) / args.train_seconds
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        if frac >= chat_from and chat_stream is not None:  # chat phase: half chat, half prose
            half = args.batch // 2
            a = batches(pre_stream, args.batch - half, SEQ, gen)
            c = batches(chat_stream, half, SEQ, gen)
            x, y1, y2 = (torch.cat([p, q]) for p, q in zip(a, c))
        else:
            x, y1, y2 = batches(pre_stream, args.batch, SEQ, gen)
        x, y1, y2 = x.to(device, non_blocking=True), y1.to(device), y2.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, mtp_loss, aux = forward_losses(model, mtp, x, y1, y2)
            total = loss + args.mtp_weight * mtp_loss + model.config.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if step % 10 == 0 or step == 1:
            torch.cuda.synchronize()
            elapsed = time.time() - start
            curve.append({"step": step, "seconds": round(elapsed, 2), "tokens": tokens, "lr": lr,
                          "loss": loss.item(), "mtp_loss": mtp_loss.item(), "aux": float(aux),
                          "phase": "chat" if frac >= chat_from else "pretrain"})
            if step % 50 == 0 or step == 1:
                log(f"step {step} {elapsed:.0f}s loss {loss.item():.4f} mtp {mtp_loss.item():.4f} "
                    f"aux {float(aux):.3f} lr {lr:.2e} {tokens / elapsed:.0f} tok/s")
    return curve, step, tokens, time.time() - start


# ------------------------------------------------------------------------------------------------
# Checkpoint

def round_to_bf16(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def save_checkpoint(model, mtp, config, out, shard_bytes=15 * 10**6):
    from safetensors.torch import save_file
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    tensors.update({"mtp." + k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in mtp.state_dict().items()})
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * 2
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * 2 for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    cfg = config.to_dict()
    cfg["mtp_num_hidden_layers"] = 1
    cfg["architectures"] = ["Qwen3_5MoeForCausalLM"]
    cfg["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return len(shards), total


# ------------------------------------------------------------------------------------------------
# Evaluation (float32, the bf16-rounded weights that were saved)

def windows_of(ids, ctx):
    return [ids[i:i + ctx] for i in range(0, len(ids), ctx) if len(ids[i:i + ctx]) >= 2]


@torch.no_grad()
def perplexity(model, ids, device, ctx=PPL_CTX):
    """lode ppl's definition: non-overlapping windows of ctx tokens, each from an empty state, every
    position i >= 1 scored by -log p(token_i | tokens_<i); NLL summed in double."""
    per_window, total, scored = [], 0.0, 0
    for w in windows_of(ids, ctx):
        x = torch.tensor([w], device=device)
        logits = model(input_ids=x).logits[0].double()
        nll = -torch.log_softmax(logits[:-1], dim=-1).gather(1, x[0, 1:, None]).sum().item()
        per_window.append(nll)
        total += nll
        scored += len(w) - 1
    return {"ppl": math.exp(total / scored), "mean_nll": total / scored, "scored": scored,
            "windows": len(per_window), "window_nll": per_window}


def unigram_baseline(train_ids, ids, ctx=PPL_CTX):
    counts = torch.bincount(train_ids.long(), minlength=VOCAB).double() + 1.0
    logp = torch.log(counts / counts.sum())
    total, scored = 0.0, 0
    for w in windows_of(ids, ctx):
        t = torch.tensor(w[1:])
        total -= logp[t].sum().item()
        scored += len(t)
    return {"ppl": math.exp(total / scored), "mean_nll": total / scored}


@torch.no_grad()
def sample(model, tok, prompt, device, n, temperature, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = tok.encode(prompt, add_special_tokens=False).ids
    out = []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids + out], device=device)).logits[0, -1].float()
        nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=gen).item()
        if nxt in (0, 2):  # <|endoftext|>, <|im_end|>
            break
        out.append(nxt)
    return tok.decode(out, skip_special_tokens=False)


@torch.no_grad()
def needle_accuracy(model, tok, cases, device):
    """Greedy decoding gives the answer iff, teacher-forced, every answer token is the argmax."""
    right = 0
    for c in cases:
        p = tok.encode(c["prompt"], add_special_tokens=False).ids
        a = tok.encode(c["answer"], add_special_tokens=False).ids
        x = torch.tensor([p + a], device=device)
        logits = model(input_ids=x).logits[0]
        pred = logits[len(p) - 1:len(p) - 1 + len(a)].argmax(-1).tolist()
        right += pred == a
    return {"cases": len(cases), "correct": right, "accuracy": right / max(1, len(cases)),
            "prompt_tokens_mean": sum(len(tok.encode(c["prompt"]).ids) for c in cases[:5]) / max(1, min(5, len(cases)))}


@torch.no_grad()
def routing_and_mtp(model, mtp, ids, device, n_windows):
    usage = {}
    hooks = []
    for name, module in model.named_modules():
        if name.endswith("mlp.gate") and hasattr(module, "weight") and name.startswith("model.layers."):
            layer = int(name.split(".")[2])
            usage[layer] = torch.zeros(model.config.num_experts, dtype=torch.long)

            def hook(mod, args, layer=layer):
                xin = args[0].reshape(-1, mod.weight.shape[-1]).float()
                top = torch.topk(torch.softmax(xin @ mod.weight.float().t(), -1), model.config.num_experts_per_tok, -1).indices
                usage[layer] += torch.bincount(top.reshape(-1).cpu(), minlength=model.config.num_experts)
            hooks.append(module.register_forward_pre_hook(hook))
    agree = right2 = count = 0
    for w in windows_of(ids, PPL_CTX)[:n_windows]:
        x = torch.tensor([w], device=device)
        out = model.model(input_ids=x)
        h = out.last_hidden_state
        main = model.lm_head(h)[0].argmax(-1)
        u = mtp(model, model.model.embed_tokens(x[:, 1:]), h[:, :-1], 1)
        draft = model.lm_head(u)[0].argmax(-1)  # draft[t] predicts token t+2
        n = len(w) - 2
        agree += (draft[:n] == main[1:n + 1]).sum().item()
        right2 += (draft[:n] == x[0, 2:]).sum().item()
        count += n
    for hk in hooks:
        hk.remove()
    layers = {}
    for layer, counts in sorted(usage.items()):
        share = (counts.double() / counts.sum()).tolist()
        layers[layer] = {"counts": counts.tolist(), "max_share": max(share), "min_share": min(share),
                         "max_over_uniform": max(share) * len(share),
                         "entropy_bits": -sum(s * math.log2(s) for s in share if s > 0)}
    return layers, {"positions": count, "agree_with_main_next_next": agree / max(1, count),
                    "matches_true_next_next": right2 / max(1, count)}


def plot_curve(curve, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    steps = [c["step"] for c in curve]
    ax.plot(steps, [c["loss"] for c in curve], label="next-token loss (main)")
    ax.plot(steps, [c["mtp_loss"] for c in curve], label="next-next-token loss (MTP)", alpha=0.8)
    chat = [c["step"] for c in curve if c["phase"] == "chat"]
    if chat:
        ax.axvline(chat[0], color="gray", linestyle="--", linewidth=1, label="chat phase starts")
    ax.set_xlabel("step (batch of 48 x 1024 tokens)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("lode-mini training")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return str(path)


# ------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=pathlib.Path, required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--train-seconds", type=float, default=300)
    ap.add_argument("--chat-fraction", type=float, default=0.12)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--smoke", action="store_true", help="tiny data and evals, to check the script")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    torch.manual_seed(1234)
    random.seed(1234)
    metrics = {"args": {k: str(v) for k, v in vars(args).items()}, "errors": []}
    import transformers
    import tokenizers
    metrics["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__, "gpu": torch.cuda.get_device_name()}

    def save_metrics():
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1))

    limit = 300 if args.smoke else None
    train_docs = [d["text"] for d in read_jsonl(args.corpus / "train.jsonl")][:limit]
    needle_docs = [d["text"] for d in read_jsonl(args.corpus / "needles_train.jsonl")][:limit]
    chat_docs = [render_chat(d["messages"]) for d in read_jsonl(args.corpus / "chat_train.jsonl")][:limit]
    heldout_text = (args.corpus / "heldout.txt").read_text(encoding="utf-8")
    if args.smoke:
        heldout_text = heldout_text[:40000]
    log(f"corpus: {len(train_docs)} docs, {len(needle_docs)} needle docs, {len(chat_docs)} chats")

    t0 = time.time()
    tok = train_tokenizer(train_docs + needle_docs[:2000] + chat_docs[:2000], args.out / "tokenizer.json")
    metrics["tokenizer_seconds"] = time.time() - t0
    eot = tok.token_to_id("<|endoftext|>")
    assert (eot, tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")) == (0, 1, 2)
    docs = train_docs + needle_docs
    random.Random(7).shuffle(docs)
    pre_stream = token_stream(tok, docs, eot)
    chat_stream = token_stream(tok, chat_docs, eot) if chat_docs else None
    heldout_ids = tok.encode(heldout_text, add_special_tokens=False).ids
    metrics["data"] = {"train_tokens": pre_stream.numel(), "chat_tokens": 0 if chat_stream is None else chat_stream.numel(),
                       "heldout_tokens": len(heldout_ids), "heldout_bytes": len(heldout_text.encode("utf-8")),
                       "train_bytes": sum(len(d.encode("utf-8")) for d in docs)}
    log("data:", metrics["data"])
    save_metrics()

    config = make_config(max_positions=32768)
    model = transformers.Qwen3_5MoeForCausalLM(config)
    mtp = Mtp(config)
    init_weights(model, mtp)
    model.to(device)
    mtp.to(device)
    choose_kernels(model, mtp, device, metrics)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    metrics["parameters"] = {"main": n_main, "mtp": n_mtp}
    log(f"parameters: main {n_main / 1e6:.2f} M, mtp {n_mtp / 1e6:.2f} M; attn {model.config._attn_implementation}")

    model.train()
    mtp.train()
    curve, steps, tokens, seconds = train(model, mtp, pre_stream, chat_stream,
                                          argparse.Namespace(**{**vars(args), "train_seconds": 20 if args.smoke else args.train_seconds}),
                                          device)
    metrics["training"] = {"steps": steps, "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
                           "batch": args.batch, "seq": SEQ, "curve": curve}
    log(f"trained {steps} steps, {tokens / 1e6:.1f} M tokens in {seconds:.0f} s")
    save_metrics()

    model.eval()
    mtp.eval()
    round_to_bf16(model)
    round_to_bf16(mtp)
    n_shards, total = save_checkpoint(model, mtp, config, args.out)
    log(f"checkpoint: {n_shards} shards, {total / 1e6:.1f} MB (bf16)")
    model.float()
    mtp.float()

    def step(name, fn):
        t = time.time()
        try:
            metrics[name] = fn()
            log(f"{name}: {time.time() - t:.1f} s")
        except Exception:  # noqa: BLE001 - keep the model and the other figures
            metrics["errors"].append(f"{name}: {traceback.format_exc()}")
            log(f"{name} FAILED:\n{traceback.format_exc()}")
        save_metrics()

    step("heldout_perplexity", lambda: perplexity(model, heldout_ids, device))
    step("unigram_baseline", lambda: unigram_baseline(pre_stream, heldout_ids))
    heldout_docs = read_jsonl(args.corpus / "heldout.jsonl")
    prompts = []
    for source in sorted({d["source"] for d in heldout_docs}):
        doc = next(d for d in heldout_docs if d["source"] == source and len(d["text"]) > 400)
        prompts.append(doc["text"][:160])
    prompts.append("<|im_start|>user\nWhat does the ls command do?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    step("samples", lambda: [{"prompt": p, "temperature": 0.7, "text": sample(model, tok, p, device, 96, 0.7, 11 + i)}
                             for i, p in enumerate(prompts)])
    for size in ("1k", "4k", "16k"):
        cases = read_jsonl(args.corpus / f"needles_eval_{size}.jsonl")[:5 if args.smoke else None]
        step(f"needles_{size}", lambda cases=cases: needle_accuracy(model, tok, cases, device))
    step("routing_and_mtp", lambda: dict(zip(("routing", "mtp"), routing_and_mtp(model, mtp, heldout_ids, device, 4 if args.smoke else 40))))
    step("curve_png", lambda: plot_curve(metrics["training"]["curve"], args.out / "curve.png"))
    log("done; errors:", len(metrics["errors"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
