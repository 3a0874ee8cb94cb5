// llama_logits: llama.cpp as a logits oracle for GGUF models.
//
// Loads the npm CPU build of llama.cpp (libllama.v0.5.0.so and its libggml*.so) with dlopen, runs
// one batch over the given prompt tokens and writes float32 logits for every position, row-major
// [n_tokens, n_vocab]. With --greedy N it then decodes N tokens greedily, one at a time, and prints
// their ids plus the top-2 probabilities of every step (so near-ties can be told from real
// disagreements). See tools/oracle/README.md ("llama_logits") for the command line.
//
// No llama.cpp headers ship with the npm build: the few structs and functions used here are declared
// by hand from shared/notes/llama-cpp-oracle.md, and check_abi() holds the declarations to what the
// library's *_default_params() functions actually write before anything is trusted.
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- the declared ABI (llama.cpp build b1-0ad4a86, llama_version() = 0.5.0-dev) ----

typedef int32_t llama_token;
typedef int32_t llama_pos;
typedef int32_t llama_seq_id;

// 80 bytes.
struct llama_model_params {
  void *devices;
  void *tensor_buft_overrides;
  int32_t n_gpu_layers;
  int32_t split_mode;
  int32_t load_mode;
  int32_t lazy_mode;
  int32_t main_gpu;
  const float *tensor_split;
  void *progress_callback;
  void *progress_callback_user_data;
  const void *kv_overrides;
  bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

// 160 bytes.
struct llama_context_params {
  uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
  int32_t n_threads, n_threads_batch;
  int32_t ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
  float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
  uint32_t yarn_orig_ctx;
  float defrag_thold;
  void *cb_eval;
  void *cb_eval_user_data;
  int32_t type_k, type_v;
  void *abort_callback;
  void *abort_callback_data;
  bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
  void *samplers;
  size_t n_samplers;
  void *ctx_other;
};

// 56 bytes.
struct llama_batch {
  int32_t n_tokens;
  llama_token *token;
  float *embd;
  llama_pos *pos;
  int32_t *n_seq_id;
  llama_seq_id **seq_id;
  int8_t *logits;
};

_Static_assert(sizeof(struct llama_model_params) == 80, "llama_model_params is 80 bytes in this build");
_Static_assert(sizeof(struct llama_context_params) == 160, "llama_context_params is 160 bytes in this build");
_Static_assert(sizeof(struct llama_batch) == 56, "llama_batch is 56 bytes in this build");

enum { kLogLevelError = 4 };  // enum ggml_log_level: none, debug, info, warn, error, cont

typedef void (*log_callback)(int level, const char *text, void *user_data);

static struct {
  void (*backend_load_all_from_path)(const char *dir);
  void (*log_set)(log_callback callback, void *user_data);
  void (*backend_init)(void);
  void (*backend_free)(void);
  const char *(*version)(void);
  struct llama_model_params (*model_default_params)(void);
  struct llama_context_params (*context_default_params)(void);
  void *(*model_load_from_file)(const char *path, struct llama_model_params params);
  void (*model_free)(void *model);
  const void *(*model_get_vocab)(const void *model);
  int32_t (*vocab_n_tokens)(const void *vocab);
  void *(*init_from_model)(void *model, struct llama_context_params params);
  void (*free)(void *ctx);
  struct llama_batch (*batch_init)(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
  void (*batch_free)(struct llama_batch batch);
  int32_t (*decode)(void *ctx, struct llama_batch batch);
  float *(*get_logits_ith)(void *ctx, int32_t i);
  int32_t (*tokenize)(const void *vocab, const char *text, int32_t text_len, llama_token *tokens,
                      int32_t n_tokens_max, bool add_special, bool parse_special);
} api;

static _Noreturn void die(const char *format, ...) {
  va_list args;
  va_start(args, format);
  fputs("llama_logits: ", stderr);
  vfprintf(stderr, format, args);
  fputc('\n', stderr);
  va_end(args);
  exit(1);
}

static void *open_library(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  // RTLD_GLOBAL: libllama resolves ggml symbols, and the CPU backend variants loaded later by
  // ggml_backend_load_all_from_path resolve libggml-base's.
  void *library = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!library) die("cannot load %s (%s): pass the folder tools/oracle/fetch prints as --lib", path, dlerror());
  return library;
}

static void *symbol(void *library, const char *name) {
  void *address = dlsym(library, name);
  if (!address) die("the library exports no %s: is this the npm build shared/notes/llama-cpp-oracle.md names?", name);
  return address;
}

static void load_api(const char *dir) {
  void *ggml = open_library(dir, "libggml.v0.5.0.so");
  void *llama = open_library(dir, "libllama.v0.5.0.so");
  *(void **)&api.backend_load_all_from_path = symbol(ggml, "ggml_backend_load_all_from_path");
  *(void **)&api.log_set = symbol(llama, "llama_log_set");
  *(void **)&api.backend_init = symbol(llama, "llama_backend_init");
  *(void **)&api.backend_free = symbol(llama, "llama_backend_free");
  *(void **)&api.version = symbol(llama, "llama_version");
  *(void **)&api.model_default_params = symbol(llama, "llama_model_default_params");
  *(void **)&api.context_default_params = symbol(llama, "llama_context_default_params");
  *(void **)&api.model_load_from_file = symbol(llama, "llama_model_load_from_file");
  *(void **)&api.model_free = symbol(llama, "llama_model_free");
  *(void **)&api.model_get_vocab = symbol(llama, "llama_model_get_vocab");
  *(void **)&api.vocab_n_tokens = symbol(llama, "llama_vocab_n_tokens");
  *(void **)&api.init_from_model = symbol(llama, "llama_init_from_model");
  *(void **)&api.free = symbol(llama, "llama_free");
  *(void **)&api.batch_init = symbol(llama, "llama_batch_init");
  *(void **)&api.batch_free = symbol(llama, "llama_batch_free");
  *(void **)&api.decode = symbol(llama, "llama_decode");
  *(void **)&api.get_logits_ith = symbol(llama, "llama_get_logits_ith");
  *(void **)&api.tokenize = symbol(llama, "llama_tokenize");
}

// Index of the last byte a struct-returning function writes. Structs over 16 bytes return through a
// hidden pointer passed as the first argument (x86-64 SysV), so the function is called here with a
// 256-byte buffer of its own; two different fill bytes tell written bytes from untouched ones.
static int last_written_byte(void *function) {
  void *(*call)(void *hidden_return) = (void *(*)(void *))function;
  unsigned char buffer[256];
  int last = -1;
  for (int fill = 0; fill < 2; ++fill) {
    unsigned char canary = fill ? 0x55 : 0xAA;
    memset(buffer, canary, sizeof(buffer));
    call(buffer);
    for (int i = (int)sizeof(buffer) - 1; i > last; --i)
      if (buffer[i] != canary) { last = i; break; }
  }
  return last;
}

// Holds the declared structs to the library: their size (what *_default_params writes; the model
// params end in six bools, so up to two padding bytes may stay unwritten) and the default values
// the notes recorded for this build at known offsets.
static void check_abi(void) {
  int model_last = last_written_byte(*(void **)&api.model_default_params);
  int context_last = last_written_byte(*(void **)&api.context_default_params);
  if (model_last < 77 || model_last > 79)
    die("llama_model_default_params writes %d bytes, the declared struct has 80: ABI mismatch", model_last + 1);
  if (context_last != 159)
    die("llama_context_default_params writes %d bytes, the declared struct has 160: ABI mismatch", context_last + 1);
  struct llama_model_params m = api.model_default_params();
  struct llama_context_params c = api.context_default_params();
  if (m.split_mode != 1 || !m.use_extra_bufts || m.vocab_only || m.load_mtp)
    die("llama_model_default_params fields differ from the declared layout: ABI mismatch");
  if (c.n_ctx != 512 || c.n_batch != 2048 || c.n_ubatch != 512 || c.n_seq_max != 1 ||
      c.n_outputs_max_per_seq != 1 || c.type_k != 1 || c.type_v != 1 || c.embeddings || !c.offload_kqv ||
      c.ctx_other != NULL)
    die("llama_context_default_params fields differ from the declared layout: ABI mismatch");
}

// ---- command line ----

struct options {
  const char *model_path;
  const char *lib_dir;
  const char *out_path;
  const char *greedy_logits_path;
  llama_token *tokens;
  int n_tokens;
  int greedy;
  int threads;
  bool verbose;
  const char *tokenize_path;  // --tokenize: tokenizer mode
  bool parse_special;
  int32_t type_k, type_v;  // K/V cache types (ggml type ids); f16 unless --cache-type-k/-v
  bool flash_attn;         // --flash-attn (llama.cpp needs it for a quantized V cache)
};

static void usage(void) {
  fputs("usage: llama_logits MODEL.gguf --tokens 1,2,3|@FILE [-o OUT.f32] [--greedy N [--greedy-logits G.f32]]\n"
        "                    [--threads N] [--lib DIR] [--verbose]\n"
        "  -o OUT.f32    float32 logits of every prompt position, row-major [n_tokens, n_vocab]\n"
        "  --greedy N    also decode N tokens greedily; prints their ids on one line, then one line per\n"
        "                step: 'step I top1 ID P top2 ID P'\n"
        "  --greedy-logits G.f32  the logits each greedy step chose from, [N, n_vocab] (row 0 = last\n"
        "                prompt row; rows 1.. come from one-token decodes)\n"
        "       llama_logits MODEL.gguf --tokenize TEXT_FILE [--special]\n"
        "  --tokenize F  print llama.cpp's token ids of the file's text on one line, and on stderr the\n"
        "                time llama_tokenize took (best of 3); --special parses special-token text\n"
        "  --cache-type-k T, --cache-type-v T  K/V cache types: f32, f16 (default), q8_0, q4_0\n"
        "  --flash-attn  flash attention (llama.cpp needs it for a quantized V cache)\n"
        "  The prompt's llama_decode time goes to stderr: 'prompt: N tokens in S s'.\n"
        "  --lib DIR     folder of libllama.v0.5.0.so (default: $LODE_LLAMA_LIB; tools/oracle/fetch prints it)\n",
        stderr);
  exit(2);
}

static long parse_int(const char *text, const char *what, long min, long max) {
  char *end;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || end == text || *end || value < min || value > max)
    die("%s must be an integer in [%ld, %ld], got '%s'", what, min, max, text);
  return value;
}

static char *read_text_file(const char *path, size_t *size_out) {
  FILE *file = fopen(path, "rb");
  if (!file) die("cannot open token file %s: %s", path, strerror(errno));
  size_t capacity = 1 << 16, size = 0;
  char *text = malloc(capacity);
  size_t got;
  while ((got = fread(text + size, 1, capacity - size - 1, file)) > 0) {
    size += got;
    if (capacity - size - 1 == 0) text = realloc(text, capacity *= 2);
  }
  fclose(file);
  text[size] = 0;
  if (size_out) *size_out = size;
  return text;
}

// Token ids separated by commas and/or whitespace; "@FILE" reads them from FILE.
static void parse_tokens(const char *argument, struct options *options) {
  char *text = argument[0] == '@' ? read_text_file(argument + 1, NULL) : strdup(argument);
  int capacity = 16;
  options->tokens = malloc(sizeof(llama_token) * capacity);
  options->n_tokens = 0;
  for (char *item = strtok(text, ", \t\r\n"); item; item = strtok(NULL, ", \t\r\n")) {
    if (options->n_tokens == capacity) options->tokens = realloc(options->tokens, sizeof(llama_token) * (capacity *= 2));
    options->tokens[options->n_tokens++] = (llama_token)parse_int(item, "a token id", 0, INT32_MAX);
  }
  free(text);
  if (options->n_tokens == 0) die("--tokens holds no token ids");
}

// ggml's type id of a cache type name.
static int32_t cache_type(const char *name) {
  if (!strcmp(name, "f32")) return 0;
  if (!strcmp(name, "f16")) return 1;
  if (!strcmp(name, "q4_0")) return 2;
  if (!strcmp(name, "q8_0")) return 8;
  die("cache type must be f32, f16, q8_0 or q4_0, got '%s'", name);
  return -1;
}

static struct options parse_options(int argc, char **argv) {
  struct options options = {.threads = 2, .lib_dir = getenv("LODE_LLAMA_LIB"), .type_k = 1, .type_v = 1};
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    bool has_value = i + 1 < argc;
    if (!strcmp(arg, "--tokens") && has_value) parse_tokens(argv[++i], &options);
    else if (!strcmp(arg, "-o") && has_value) options.out_path = argv[++i];
    else if (!strcmp(arg, "--greedy") && has_value) options.greedy = (int)parse_int(argv[++i], "--greedy", 0, 1 << 20);
    else if (!strcmp(arg, "--greedy-logits") && has_value) options.greedy_logits_path = argv[++i];
    else if (!strcmp(arg, "--threads") && has_value) options.threads = (int)parse_int(argv[++i], "--threads", 1, 1024);
    else if (!strcmp(arg, "--lib") && has_value) options.lib_dir = argv[++i];
    else if (!strcmp(arg, "--verbose")) options.verbose = true;
    else if (!strcmp(arg, "--tokenize") && has_value) options.tokenize_path = argv[++i];
    else if (!strcmp(arg, "--special")) options.parse_special = true;
    else if (!strcmp(arg, "--cache-type-k") && has_value) options.type_k = cache_type(argv[++i]);
    else if (!strcmp(arg, "--cache-type-v") && has_value) options.type_v = cache_type(argv[++i]);
    else if (!strcmp(arg, "--flash-attn")) options.flash_attn = true;
    else if (arg[0] != '-' && !options.model_path) options.model_path = arg;
    else usage();
  }
  if (!options.model_path || (!options.tokens && !options.tokenize_path)) usage();
  if (!options.lib_dir) die("no library folder: pass --lib DIR or set LODE_LLAMA_LIB (tools/oracle/fetch prints it)");
  if (options.tokenize_path) return options;
  if (!options.out_path && options.greedy == 0) die("nothing to do: pass -o OUT.f32 and/or --greedy N");
  if (options.greedy_logits_path && options.greedy == 0) die("--greedy-logits needs --greedy N");
  return options;
}

// ---- running the model ----

static void quiet_log(int level, const char *text, void *user_data) {
  (void)user_data;
  if (level == kLogLevelError) fputs(text, stderr);
}

static void *load_model(const struct options *options) {
  api.log_set(options->verbose ? NULL : quiet_log, NULL);
  api.backend_load_all_from_path(options->lib_dir);  // registers the CPU backend variants
  api.backend_init();
  struct llama_model_params params = api.model_default_params();
  params.n_gpu_layers = 0;
  // ggml's own quantized kernels, whatever the CPU: the extra buffer types repack the weights for
  // the CPU's matrix units (AMX on a Sapphire Rapids host), and that build's path there gave logits
  // 75-90% off in relative L2 for prompts of 37 and 80 tokens (LlamaParity, 2026-12-06), where the
  // plain kernels stay within 1.2% of lode's q8 activations.
  params.use_extra_bufts = false;
  params.vocab_only = options->tokenize_path != NULL;
  void *model = api.model_load_from_file(options->model_path, params);
  if (!model) die("llama.cpp could not load %s (rerun with --verbose for its log)", options->model_path);
  return model;
}

static void *create_context(void *model, const struct options *options) {
  struct llama_context_params params = api.context_default_params();
  uint32_t positions = (uint32_t)(options->n_tokens + options->greedy);
  params.n_ctx = positions;
  params.n_batch = (uint32_t)options->n_tokens;  // the whole prompt in one llama_decode
  params.n_ubatch = (uint32_t)options->n_tokens;
  params.n_seq_max = 1;
  params.n_outputs_max_per_seq = 0;  // 0 = n_batch: logits for every position, not only the last
  params.n_threads = options->threads;
  params.n_threads_batch = options->threads;
  params.type_k = options->type_k;
  params.type_v = options->type_v;
  if (options->flash_attn) params.flash_attn_type = 1;  // enabled
  void *ctx = api.init_from_model(model, params);
  if (!ctx) die("llama_init_from_model failed (rerun with --verbose for its log)");
  return ctx;
}

// Decodes tokens at positions first_pos.. of sequence 0, asking for logits at every one of them.
static void decode(void *ctx, const llama_token *tokens, int n, int first_pos) {
  struct llama_batch batch = api.batch_init(n, 0, 1);
  batch.n_tokens = n;
  for (int i = 0; i < n; ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = first_pos + i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  int32_t status = api.decode(ctx, batch);
  api.batch_free(batch);
  if (status != 0) die("llama_decode returned %d at position %d (a token id past the vocabulary?)", status, first_pos);
}

static const float *logits_row(void *ctx, int i) {
  const float *row = api.get_logits_ith(ctx, i);
  if (!row) die("llama.cpp kept no logits for output %d", i);
  return row;
}

static FILE *create_file(const char *path) {
  FILE *file = fopen(path, "wb");
  if (!file) die("cannot create %s: %s", path, strerror(errno));
  return file;
}

// Appends one logits row; returns how many of its values are not finite.
static int write_row(FILE *file, const char *path, const float *row, int n_vocab) {
  if (fwrite(row, sizeof(float), (size_t)n_vocab, file) != (size_t)n_vocab) die("writing %s failed", path);
  int non_finite = 0;
  for (int v = 0; v < n_vocab; ++v) non_finite += !isfinite(row[v]);
  return non_finite;
}

static void close_file(FILE *file, const char *path, int n_rows, int n_vocab, int non_finite) {
  if (fclose(file) != 0) die("writing %s failed", path);
  fprintf(stderr, "llama_logits: wrote %s: %d x %d float32\n", path, n_rows, n_vocab);
  if (non_finite) fprintf(stderr, "llama_logits: WARNING: %s holds %d non-finite logits\n", path, non_finite);
}

static void write_prompt_logits(void *ctx, const struct options *options, int n_vocab) {
  FILE *out = create_file(options->out_path);
  int non_finite = 0;
  for (int i = 0; i < options->n_tokens; ++i)
    non_finite += write_row(out, options->out_path, logits_row(ctx, i), n_vocab);
  close_file(out, options->out_path, options->n_tokens, n_vocab, non_finite);
}

struct top2 {
  int id[2];
  double p[2];
};

// The two most likely tokens of a logits row and their softmax probabilities (in double; ties go to
// the lower id, as an argmax scan does).
static struct top2 top_two(const float *row, int n_vocab) {
  struct top2 top = {{0, n_vocab > 1 ? 1 : 0}, {0, 0}};
  if (n_vocab > 1 && row[1] > row[0]) top.id[0] = 1, top.id[1] = 0;
  for (int v = 2; v < n_vocab; ++v) {
    if (row[v] > row[top.id[0]]) top.id[1] = top.id[0], top.id[0] = v;
    else if (row[v] > row[top.id[1]]) top.id[1] = v;
  }
  double max = row[top.id[0]], sum = 0;
  for (int v = 0; v < n_vocab; ++v) sum += exp((double)row[v] - max);
  for (int k = 0; k < 2; ++k) top.p[k] = exp((double)row[top.id[k]] - max) / sum;
  return top;
}

// Greedy continuation: step 0 reads the last prompt row; every later step decodes the previous
// choice at the next position and reads its row.
static void greedy_decode(void *ctx, const struct options *options, int n_vocab) {
  llama_token *ids = malloc(sizeof(llama_token) * options->greedy);
  struct top2 *steps = malloc(sizeof(struct top2) * options->greedy);
  const char *rows_path = options->greedy_logits_path;
  FILE *rows = rows_path ? create_file(rows_path) : NULL;
  int non_finite = 0;
  for (int step = 0; step < options->greedy; ++step) {
    if (step > 0) decode(ctx, &ids[step - 1], 1, options->n_tokens + step - 1);
    const float *row = logits_row(ctx, step == 0 ? options->n_tokens - 1 : 0);
    if (rows) non_finite += write_row(rows, rows_path, row, n_vocab);
    steps[step] = top_two(row, n_vocab);
    ids[step] = steps[step].id[0];
  }
  if (rows) close_file(rows, rows_path, options->greedy, n_vocab, non_finite);
  for (int step = 0; step < options->greedy; ++step) printf(step ? " %d" : "%d", ids[step]);
  printf("\n");
  for (int step = 0; step < options->greedy; ++step)
    printf("step %d top1 %d %.6f top2 %d %.6f\n", step, steps[step].id[0], steps[step].p[0], steps[step].id[1],
           steps[step].p[1]);
  free(steps);
  free(ids);
}

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// llama.cpp's tokenizer on a text file: the ids on stdout, the best of three timings on stderr.
static void tokenize_file(void *model, const struct options *options) {
  size_t size = 0;  // the text may hold NUL bytes: its length is the file's
  char *text = read_text_file(options->tokenize_path, &size);
  const int32_t length = (int32_t)size;
  const void *vocab = api.model_get_vocab(model);
  int32_t capacity = length + 16;
  llama_token *ids = malloc(sizeof(llama_token) * (size_t)capacity);
  int32_t n = 0;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double start = now_seconds();
    n = api.tokenize(vocab, text, length, ids, capacity, false, options->parse_special);
    const double seconds = now_seconds() - start;
    if (n < 0) die("llama_tokenize needs room for %d tokens", -n);
    if (seconds < best) best = seconds;
  }
  for (int32_t i = 0; i < n; ++i) printf(i ? " %d" : "%d", ids[i]);
  printf("\n");
  fprintf(stderr, "%d bytes -> %d tokens in %.3f s (%.0f tokens/s, %.1f MB/s)\n", length, n, best,
          n / best, length / 1e6 / best);
  free(ids);
  free(text);
}

int main(int argc, char **argv) {
  struct options options = parse_options(argc, argv);
  load_api(options.lib_dir);
  check_abi();
  void *model = load_model(&options);
  if (options.tokenize_path) {
    tokenize_file(model, &options);
    api.model_free(model);
    api.backend_free();
    return 0;
  }
  int n_vocab = api.vocab_n_tokens(api.model_get_vocab(model));
  for (int i = 0; i < options.n_tokens; ++i)
    if (options.tokens[i] >= n_vocab) die("token %d at position %d is past the vocabulary (%d)", options.tokens[i], i, n_vocab);
  void *ctx = create_context(model, &options);
  const double start = now_seconds();
  decode(ctx, options.tokens, options.n_tokens, 0);
  const double seconds = now_seconds() - start;
  fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tokens/s)\n", options.n_tokens, seconds, options.n_tokens / seconds);
  if (options.out_path) write_prompt_logits(ctx, &options, n_vocab);
  if (options.greedy > 0) greedy_decode(ctx, &options, n_vocab);
  api.free(ctx);
  api.model_free(model);
  api.backend_free();
  free(options.tokens);
  return 0;
}
