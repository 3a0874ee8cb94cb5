// A load generator for `lode serve` (or any OpenAI-compatible server), built on the official
// `openai` npm client (the pinned copy tools/server/fetch installs). N concurrent streams run
// chat requests of given prompt and reply lengths, a share of each prompt common to all (a system
// prompt), a share of requests abandoned after their first tokens; it reports aggregate decode
// tokens/s (over the time some stream was decoding), tokens/s all in (over the wall time, prompts
// and gaps between requests included), time to first token and inter-token latency (p50 / p99),
// and errors.
//
//   node tools/load/load.mjs --url http://127.0.0.1:8080 [--concurrency 4] [--requests 16]
//        [--prompt-words 200] [--max-tokens 128] [--shared-prefix 0.5] [--disconnect 0]
//        [--api-key KEY] [--model NAME] [--seed 1] [--temperature 0] [--json]
//
// Prompt lengths are in words (the server's tokenizer decides the tokens; the report gives the
// prompt tokens the server counted). Every request streams with stream_options.include_usage, so
// the tokens of a reply are the server's count. Exits 1 when any request failed.
import OpenAI from "../server/node_modules/openai/index.mjs";

const defaults = {
  url: "http://127.0.0.1:8080", concurrency: 4, requests: 0, "prompt-words": 200, "max-tokens": 128,
  "shared-prefix": 0.5, disconnect: 0, "api-key": process.env.LODE_API_KEY ?? "", model: "", seed: 1, temperature: 0,
  json: false,
};

function parseArgs(argv) {
  const o = { ...defaults };
  for (let i = 0; i < argv.length; ++i) {
    const name = argv[i].replace(/^--/, "");
    if (!(name in defaults) || !argv[i].startsWith("--")) throw new Error(`unknown option ${argv[i]} (see the header of load.mjs)`);
    if (typeof defaults[name] === "boolean") { o[name] = true; continue; }
    if (i + 1 >= argv.length) throw new Error(`--${name} needs a value`);
    const value = argv[++i];
    o[name] = typeof defaults[name] === "number" ? Number(value) : value;
    if (typeof defaults[name] === "number" && !Number.isFinite(o[name])) throw new Error(`--${name} ${value} is not a number`);
  }
  if (o.requests === 0) o.requests = 4 * o.concurrency;
  if (!(o.concurrency >= 1 && o.requests >= 1)) throw new Error("--concurrency and --requests must be at least 1");
  if (!(o.temperature >= 0 && o.temperature <= 2)) throw new Error(`--temperature is between 0 and 2, got ${o.temperature}`);
  for (const share of ["shared-prefix", "disconnect"])
    if (!(o[share] >= 0 && o[share] <= 1)) throw new Error(`--${share} is a share between 0 and 1, got ${o[share]}`);
  return o;
}

// A small deterministic generator, so a run's prompts depend only on --seed.
function rng(seed) {
  let s = (seed >>> 0) || 1;
  return () => ((s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x9e3779b9) >>> 0) / 2 ** 32);
}

const kWords = ("the a file shell line text note script directory command output error list sort copy move " +
  "read write open close find count first last next other small large simple short long new old good " +
  "run test build make check show print send keep take give turn start stop begin end").split(" ");

function words(random, n) {
  const out = [];
  for (let i = 0; i < n; ++i) out.push(kWords[Math.floor(random() * kWords.length)]);
  return out.join(" ");
}

// Request i's messages: a system prompt every request shares, then a question of its own.
function messagesFor(o, i) {
  const shared = Math.round(o["prompt-words"] * o["shared-prefix"]);
  const messages = [];
  if (shared > 0) messages.push({ role: "system", content: words(rng(o.seed), shared) });
  messages.push({ role: "user", content: words(rng(o.seed * 7919 + i + 1), Math.max(1, o["prompt-words"] - shared)) });
  return messages;
}

// Seconds during which at least one of the requests was decoding: the union of their [first, last]
// piece intervals (ms).
function decodingSeconds(results) {
  const spans = results.filter((r) => r.first !== null && r.last > r.first).map((r) => [r.first, r.last])
    .sort((a, b) => a[0] - b[0]);
  let total = 0, begin = null, end = null;
  for (const [b, e] of spans) {
    if (end === null || b > end) {
      if (end !== null) total += end - begin;
      begin = b, end = e;
    } else {
      end = Math.max(end, e);
    }
  }
  if (end !== null) total += end - begin;
  return total / 1000;
}

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function runOne(client, o, i, abandon, runBegan) {
  const began = performance.now();
  // first, last: when the first and the last piece came (ms since the run began, for decoding time).
  const r = { ttft: null, gaps: [], completion: 0, prompt: 0, abandoned: false, error: null, first: null, last: null };
  const controller = new AbortController();
  let last = null;
  let pieces = 0;
  try {
    const stream = await client.chat.completions.create(
      { model: o.model || undefined, messages: messagesFor(o, i), max_tokens: o["max-tokens"], temperature: o.temperature,
        stream: true, stream_options: { include_usage: true } },
      { signal: controller.signal });
    for await (const chunk of stream) {
      if (chunk.usage) {
        r.completion = chunk.usage.completion_tokens;
        r.prompt = chunk.usage.prompt_tokens;
      }
      const delta = chunk.choices?.[0]?.delta;
      if (!delta || !(delta.content || delta.reasoning_content || delta.tool_calls)) continue;
      const now = performance.now();
      if (r.ttft === null) r.ttft = now - began, r.first = now - runBegan;
      else r.gaps.push(now - last);
      last = now;
      r.last = now - runBegan;
      if (abandon && ++pieces >= 3) {
        r.abandoned = true;
        controller.abort();
        break;
      }
    }
  } catch (e) {
    if (!r.abandoned) r.error = `${e.status ?? ""} ${e.message}`.trim();
  }
  return r;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const client = new OpenAI({
    baseURL: `${o.url.replace(/\/$/, "")}/v1`, apiKey: o["api-key"] || "no-key", maxRetries: 0, timeout: 600_000,
  });
  const choose = rng(o.seed + 17);
  const abandon = Array.from({ length: o.requests }, () => choose() < o.disconnect);
  const results = new Array(o.requests);
  let next = 0;
  const began = performance.now();
  await Promise.all(Array.from({ length: o.concurrency }, async () => {
    for (let i = next++; i < o.requests; i = next++) results[i] = await runOne(client, o, i, abandon[i], began);
  }));
  const seconds = (performance.now() - began) / 1000;

  const done = results.filter((r) => !r.error && !r.abandoned);
  const ttft = done.map((r) => r.ttft).filter((t) => t !== null).sort((a, b) => a - b);
  const gaps = done.flatMap((r) => r.gaps).sort((a, b) => a - b);
  const completion = done.reduce((n, r) => n + r.completion, 0);
  // Decode tokens: each reply's tokens after its first (which the prompt's pass gives), over the
  // time some reply was between its first and last piece.
  const decoded = done.reduce((n, r) => n + Math.max(0, r.completion - 1), 0);
  const decoding = decodingSeconds(done);
  const report = {
    url: o.url, concurrency: o.concurrency, requests: o.requests, prompt_words: o["prompt-words"],
    max_tokens: o["max-tokens"], shared_prefix: o["shared-prefix"], temperature: o.temperature,
    completed: done.length, abandoned: results.filter((r) => r.abandoned).length,
    errors: results.filter((r) => r.error).length, first_errors: results.filter((r) => r.error).slice(0, 3).map((r) => r.error),
    seconds: +seconds.toFixed(3),
    prompt_tokens_mean: done.length ? +(done.reduce((n, r) => n + r.prompt, 0) / done.length).toFixed(1) : 0,
    completion_tokens: completion,
    decode_tokens_per_s: decoding > 0 ? +(decoded / decoding).toFixed(2) : 0,
    decoding_seconds: +decoding.toFixed(3),
    tokens_per_s_all_in: +(completion / seconds).toFixed(2),
    ttft_ms: { p50: percentile(ttft, 50), p99: percentile(ttft, 99) },
    itl_ms: { p50: percentile(gaps, 50), p99: percentile(gaps, 99) },
  };
  for (const k of ["ttft_ms", "itl_ms"])
    for (const p of ["p50", "p99"]) if (report[k][p] !== null) report[k][p] = +report[k][p].toFixed(2);
  if (o.json) {
    console.log(JSON.stringify(report));
  } else {
    console.log(`${report.completed} of ${o.requests} requests completed, ${report.abandoned} abandoned, ` +
                `${report.errors} errors, in ${report.seconds} s at concurrency ${o.concurrency}`);
    console.log(`decode: ${report.completion_tokens} tokens, ${report.decode_tokens_per_s} tokens/s in all over ` +
                `${report.decoding_seconds} s of decoding (${report.tokens_per_s_all_in} over the wall time); ` +
                `prompts ${report.prompt_tokens_mean} tokens on average`);
    console.log(`time to first token: p50 ${report.ttft_ms.p50} ms, p99 ${report.ttft_ms.p99} ms; ` +
                `inter-token latency: p50 ${report.itl_ms.p50} ms, p99 ${report.itl_ms.p99} ms`);
    for (const e of report.first_errors) console.log(`error: ${e}`);
  }
  process.exit(report.errors > 0 ? 1 : 0);
}

main().catch((e) => {
  console.error(`load.mjs: ${e.message}`);
  process.exit(2);
});
