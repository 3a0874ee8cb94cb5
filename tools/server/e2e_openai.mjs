// End-to-end check of `lode serve` with the official `openai` npm client (tools/server/fetch
// installs it): models, chat (plain and streamed, which must agree at temperature 0), usage,
// completions, logprobs, and the errors the client must see as typed APIErrors.
//
//   node tools/server/e2e_openai.mjs BASE_URL [API_KEY]      (API_KEY defaults to $LODE_API_KEY)
//
// BASE_URL is the server's root (http://127.0.0.1:8080). With a key, the server must have been
// started with the same --api-key, and a wrong key must get 401; without one that check is
// skipped. Prints one JSON line of results; exits 1 at the first failed check, saying which.
import OpenAI from "openai";
import { VERSION } from "openai/version";

const [baseUrl, keyArg] = process.argv.slice(2);
if (!baseUrl) {
  console.error("usage: node e2e_openai.mjs BASE_URL [API_KEY]");
  process.exit(2);
}
const apiKey = keyArg ?? process.env.LODE_API_KEY ?? "";
const client = new OpenAI({
  baseURL: `${baseUrl.replace(/\/$/, "")}/v1`,
  apiKey: apiKey || "no-key",  // the client insists on one; a server without --api-key ignores it
  maxRetries: 0,  // a retry would hide the status the server answered first
  timeout: 60_000,
});

class CheckFailed extends Error {}
function check(condition, what) {
  if (!condition) throw new CheckFailed(what);
}
const isCount = (v) => Number.isInteger(v) && v >= 0;
const show = (v) => JSON.stringify(v);

function checkUsage(usage, where) {
  check(usage && typeof usage === "object", `${where}: no usage object`);
  for (const field of ["prompt_tokens", "completion_tokens", "total_tokens"]) {
    check(isCount(usage[field]), `${where}: usage.${field} is not a count: ${show(usage[field])}`);
  }
  check(usage.prompt_tokens > 0, `${where}: usage.prompt_tokens is 0`);
  check(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
        `${where}: usage.total_tokens ${usage.total_tokens} is not prompt + completion ${show(usage)}`);
}

// Runs `request`, which must throw an APIError of class `errorClass` with `status`; returns it.
async function expectApiError(request, errorClass, status, where) {
  try {
    await request();
  } catch (err) {
    check(err instanceof OpenAI.APIError, `${where}: threw ${err?.constructor?.name}, not an APIError: ${err}`);
    check(err instanceof errorClass, `${where}: threw ${err.constructor.name}, expected ${errorClass.name}`);
    check(err.status === status, `${where}: status ${err.status}, expected ${status}`);
    // The client surfaces the server's {"error": {...}} object and puts its message in its own.
    const message = err.error?.message;
    check(typeof message === "string" && message.length > 0, `${where}: no error.message from the server: ${show(err.error)}`);
    check(err.message.includes(message), `${where}: the client's message "${err.message}" lacks the server's "${message}"`);
    return err;
  }
  throw new CheckFailed(`${where}: the request succeeded, expected ${status}`);
}

async function checkModels() {
  const ids = [];
  for await (const model of client.models.list()) {
    check(typeof model.id === "string" && model.id.length > 0, `models.list: a model without an id: ${show(model)}`);
    check(model.object === "model", `models.list: object is ${show(model.object)}, expected "model"`);
    ids.push(model.id);
  }
  check(ids.length === 1, `models.list: ${ids.length} models, lode serves exactly one`);
  return ids[0];
}

// One chat request, plain and streamed. `thinking` on: the reply must carry reasoning_content;
// off (reasoning_effort "none"): content. Either way the streamed deltas must join to the plain
// reply's text, and the usage must agree.
async function checkChat(model, thinking) {
  const request = {
    model,
    messages: [{ role: "system", content: "You are a helpful assistant." },
               { role: "user", content: "What does the ls command do?" }],
    temperature: 0,
    max_tokens: 16,
    ...(thinking ? {} : { reasoning_effort: "none" }),
  };
  const reply = await client.chat.completions.create(request);
  check(reply.object === "chat.completion", `chat: object is ${show(reply.object)}`);
  check(typeof reply.id === "string" && reply.id.length > 0, "chat: no id");
  check(reply.model === model, `chat: model is ${show(reply.model)}, expected ${show(model)}`);
  check(reply.choices?.length === 1, `chat: ${reply.choices?.length} choices, expected 1`);
  const [choice] = reply.choices;
  check(choice.message.role === "assistant", `chat: role is ${show(choice.message.role)}`);
  check(typeof choice.message.content === "string", `chat: content is ${show(choice.message.content)}, not a string`);
  const reasoning = choice.message.reasoning_content ?? "";
  check(typeof reasoning === "string", `chat: reasoning_content is ${show(reasoning)}, not a string`);
  if (thinking) check(reasoning.length > 0, "chat (thinking): no reasoning_content");
  else check(choice.message.content.length > 0 && reasoning.length === 0,
             `chat (reasoning_effort "none"): content ${show(choice.message.content)}, reasoning_content ${show(reasoning)}`);
  check(["stop", "length"].includes(choice.finish_reason), `chat: finish_reason is ${show(choice.finish_reason)}`);
  checkUsage(reply.usage, "chat");
  check(reply.usage.completion_tokens >= 1 && reply.usage.completion_tokens <= request.max_tokens,
        `chat: completion_tokens ${reply.usage.completion_tokens} outside 1..${request.max_tokens}`);
  check(choice.finish_reason !== "length" || reply.usage.completion_tokens === request.max_tokens,
        `chat: finish_reason "length" after ${reply.usage.completion_tokens} of ${request.max_tokens} tokens`);

  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true } });
  let content = "", streamedReasoning = "", finishReason = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    check(chunk.object === "chat.completion.chunk", `chat stream: object is ${show(chunk.object)}`);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      content += c.delta?.content ?? "";
      streamedReasoning += c.delta?.reasoning_content ?? "";
      if (c.finish_reason) finishReason = c.finish_reason;
    }
  }
  check(content === choice.message.content,
        `chat stream: the joined content deltas ${show(content)} differ from the plain reply ${show(choice.message.content)}`);
  check(streamedReasoning === reasoning,
        `chat stream: the joined reasoning deltas ${show(streamedReasoning)} differ from the plain reply ${show(reasoning)}`);
  check(finishReason === choice.finish_reason, `chat stream: finish_reason ${show(finishReason)}, plain reply ${show(choice.finish_reason)}`);
  checkUsage(usage, "chat stream (include_usage)");
  check(usage.prompt_tokens === reply.usage.prompt_tokens && usage.completion_tokens === reply.usage.completion_tokens,
        `chat stream: usage ${show(usage)} differs from the plain reply's ${show(reply.usage)}`);
  return { content: choice.message.content, reasoning, finish_reason: choice.finish_reason,
           usage: reply.usage, stream_chunks: chunks };
}

async function checkCompletions(model) {
  const request = { model, prompt: "The ls command", max_tokens: 8, temperature: 0 };
  const reply = await client.completions.create(request);
  check(reply.object === "text_completion", `completions: object is ${show(reply.object)}`);
  check(reply.choices?.length === 1, `completions: ${reply.choices?.length} choices, expected 1`);
  const [choice] = reply.choices;
  check(typeof choice.text === "string" && choice.text.length > 0, `completions: text is ${show(choice.text)}`);
  check(["stop", "length"].includes(choice.finish_reason), `completions: finish_reason is ${show(choice.finish_reason)}`);
  checkUsage(reply.usage, "completions");

  let text = "";
  for await (const chunk of await client.completions.create({ ...request, stream: true })) {
    for (const c of chunk.choices) text += c.text ?? "";
  }
  check(text === choice.text, `completions stream: joined text ${show(text)} differs from the plain reply ${show(choice.text)}`);
  return { text: choice.text, usage: reply.usage };
}

// logprobs with top_logprobs through the client: one entry per token, each with its bytes and its
// alternatives best first, the sampled token's own among them at temperature 0; streamed entries
// join to the plain reply's.
async function checkLogprobs(model) {
  const request = { model, messages: [{ role: "user", content: "What does the ls command do?" }],
                    temperature: 0, max_tokens: 8, logprobs: true, top_logprobs: 3, reasoning_effort: "none" };
  const reply = await client.chat.completions.create(request);
  const entries = reply.choices[0].logprobs?.content;
  check(Array.isArray(entries) && entries.length > 0, `logprobs: no entries: ${show(reply.choices[0].logprobs)}`);
  check(entries.length <= reply.usage.completion_tokens,
        `logprobs: ${entries.length} entries for ${reply.usage.completion_tokens} tokens`);
  for (const e of entries) {
    check(typeof e.token === "string" && Array.isArray(e.bytes) && e.logprob <= 0, `logprobs: entry ${show(e)}`);
    check(e.top_logprobs.length === 3, `logprobs: ${e.top_logprobs.length} alternatives, asked for 3`);
    check(e.top_logprobs[0].token === e.token && e.top_logprobs[0].logprob === e.logprob,
          `logprobs: at temperature 0 the first alternative is not the token: ${show(e)}`);
    for (let i = 1; i < 3; i++)
      check(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob, `logprobs: alternatives not best first: ${show(e)}`);
  }
  check(entries.map((e) => e.token).join("") === reply.choices[0].message.content,
        `logprobs: the tokens ${show(entries.map((e) => e.token))} do not spell the content ${show(reply.choices[0].message.content)}`);
  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true }))
    for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
  check(show(streamed) === show(entries), `logprobs stream: the streamed entries differ from the plain reply's`);
  return { tokens: entries.length, first: entries[0] };
}

async function checkErrors(model) {
  const user = [{ role: "user", content: "Hello" }];
  const twoChoices = await expectApiError(
      () => client.chat.completions.create({ model, messages: user, n: 2, max_tokens: 4 }),
      OpenAI.BadRequestError, 400, "n: 2");
  check(twoChoices.type === "invalid_request_error", `n: 2: error type ${show(twoChoices.type)}`);
  const badRole = await expectApiError(
      () => client.chat.completions.create({ model, messages: [{ role: "wizard", content: "hi" }], max_tokens: 4 }),
      OpenAI.BadRequestError, 400, "unknown role");
  const noMessages = await expectApiError(
      () => client.chat.completions.create({ model, messages: [], max_tokens: 4 }),
      OpenAI.BadRequestError, 400, "empty messages");
  const unknownModel = await expectApiError(
      () => client.chat.completions.create({ model: `${model}-no-such-model`, messages: user, max_tokens: 4 }),
      OpenAI.NotFoundError, 404, "unknown model");
  const result = { n2: twoChoices.error.message, bad_role: badRole.error.message,
                   no_messages: noMessages.error.message, unknown_model: unknownModel.error.message };
  if (apiKey) {
    const wrongKey = new OpenAI({ baseURL: client.baseURL, apiKey: `${apiKey}-wrong`, maxRetries: 0 });
    const denied = await expectApiError(() => wrongKey.models.list(), OpenAI.AuthenticationError, 401, "wrong api key");
    result.wrong_key = denied.error.message;
  } else {
    result.wrong_key = "skipped: no API key given";
  }
  return result;
}

let step = "models.list";
try {
  const model = await checkModels();
  const results = { ok: true, client: `openai ${VERSION}`, model };
  step = "chat, thinking on";
  results.chat_thinking = await checkChat(model, true);
  step = "chat, thinking off";
  results.chat = await checkChat(model, false);
  step = "completions";
  results.completions = await checkCompletions(model);
  step = "logprobs";
  results.logprobs = await checkLogprobs(model);
  step = "error cases";
  results.errors = await checkErrors(model);
  console.log(JSON.stringify(results));
} catch (err) {
  const what = err instanceof CheckFailed ? err.message
             : err instanceof OpenAI.APIError ? `${step}: the client threw ${err.constructor.name} (status ${err.status}): ${err.message}`
             : `${step}: unexpected ${err?.constructor?.name}: ${err?.stack ?? err}`;
  console.log(JSON.stringify({ ok: false, failed: what }));
  console.error(`e2e_openai: FAILED: ${what}`);
  process.exit(1);
}
