// End-to-end check of `lode serve`'s Anthropic Messages route (POST /v1/messages) with the official
// `@anthropic-ai/sdk` npm client (tools/server/fetch installs it): a plain and a streamed message,
// which must agree at temperature 0, usage, and errors seen as typed APIErrors.
//
//   node tools/server/e2e_anthropic.mjs BASE_URL [API_KEY]   (API_KEY defaults to $LODE_API_KEY)
//
// BASE_URL is the server's root (http://127.0.0.1:8080). With a key, the server must have been
// started with the same --api-key, and a wrong one must get 401; without one that check is
// skipped. Prints one JSON line of results; exits 1 at the first failed check, saying which.
import Anthropic from "@anthropic-ai/sdk";
import { VERSION } from "@anthropic-ai/sdk/version";

const [baseArg, keyArg] = process.argv.slice(2);
if (!baseArg) {
  console.error("usage: node e2e_anthropic.mjs BASE_URL [API_KEY]");
  process.exit(2);
}
const baseUrl = baseArg.replace(/\/$/, "");
const apiKey = keyArg ?? process.env.LODE_API_KEY ?? "";
// Everything explicit, so that no ANTHROPIC_* variable of the environment steers the client.
const makeClient = (key) => new Anthropic({ baseURL: baseUrl, apiKey: key || "no-key", authToken: null,
                                            maxRetries: 0, timeout: 60_000 });
const client = makeClient(apiKey);

class CheckFailed extends Error {}
function check(condition, what) {
  if (!condition) throw new CheckFailed(what);
}
const isCount = (v) => Number.isInteger(v) && v >= 0;
const show = (v) => JSON.stringify(v);
const STOP_REASONS = ["end_turn", "max_tokens", "stop_sequence"];

// The served model's id, from the OpenAI-style /v1/models that lode serves beside this route.
async function servedModel() {
  const res = await fetch(`${baseUrl}/v1/models`, { headers: { authorization: `Bearer ${apiKey}` } });
  check(res.ok, `GET /v1/models answered ${res.status}`);
  const id = (await res.json()).data?.[0]?.id;
  check(typeof id === "string" && id.length > 0, "GET /v1/models lists no model id");
  return id;
}

// The text and thinking of a message's content blocks, each joined.
function joinBlocks(content, where) {
  check(Array.isArray(content), `${where}: content is ${show(content)}, not a list of blocks`);
  let text = "", thinking = "";
  for (const block of content) {
    if (block.type === "text") {
      check(typeof block.text === "string", `${where}: a text block without text: ${show(block)}`);
      text += block.text;
    } else if (block.type === "thinking") {
      check(typeof block.thinking === "string", `${where}: a thinking block without thinking: ${show(block)}`);
      thinking += block.thinking;
    } else {
      throw new CheckFailed(`${where}: unexpected block type ${show(block.type)} (no tools were offered)`);
    }
  }
  return { text, thinking };
}

// Runs `request`, which must throw an APIError of class `errorClass` with `status`; returns it.
async function expectApiError(request, errorClass, status, where) {
  try {
    await request();
  } catch (err) {
    check(err instanceof Anthropic.APIError, `${where}: threw ${err?.constructor?.name}, not an APIError: ${err}`);
    check(err instanceof errorClass, `${where}: threw ${err.constructor.name}, expected ${errorClass.name}`);
    check(err.status === status, `${where}: status ${err.status}, expected ${status}`);
    // Anthropic's error body: {"type": "error", "error": {"type": ..., "message": ...}}.
    const body = err.error;
    check(body?.type === "error", `${where}: the body's type is ${show(body?.type)}, expected "error": ${show(body)}`);
    check(typeof body.error?.type === "string", `${where}: no error.type in ${show(body)}`);
    check(typeof body.error?.message === "string" && body.error.message.length > 0, `${where}: no error.message in ${show(body)}`);
    return err;
  }
  throw new CheckFailed(`${where}: the request succeeded, expected ${status}`);
}

async function checkMessages(model) {
  const request = {
    model,
    system: "You are a helpful assistant.",
    messages: [{ role: "user", content: "What does the ls command do?" }],
    max_tokens: 16,
    temperature: 0,
  };
  const reply = await client.messages.create(request);
  check(reply.type === "message", `messages: type is ${show(reply.type)}`);
  check(typeof reply.id === "string" && reply.id.length > 0, "messages: no id");
  check(reply.role === "assistant", `messages: role is ${show(reply.role)}`);
  check(typeof reply.model === "string", `messages: model is ${show(reply.model)}`);
  const { text, thinking } = joinBlocks(reply.content, "messages");
  check(text.length + thinking.length > 0, "messages: no text and no thinking");
  check(STOP_REASONS.includes(reply.stop_reason), `messages: stop_reason is ${show(reply.stop_reason)}`);
  const usage = reply.usage;
  check(isCount(usage?.input_tokens) && usage.input_tokens > 0, `messages: usage.input_tokens ${show(usage?.input_tokens)}`);
  check(isCount(usage.output_tokens) && usage.output_tokens >= 1 && usage.output_tokens <= request.max_tokens,
        `messages: usage.output_tokens ${show(usage.output_tokens)} outside 1..${request.max_tokens}`);
  check(reply.stop_reason !== "max_tokens" || usage.output_tokens === request.max_tokens,
        `messages: stop_reason "max_tokens" after ${usage.output_tokens} of ${request.max_tokens} tokens`);

  // Raw events: message_start, then blocks (start, deltas, stop), message_delta, message_stop.
  const events = [];
  let streamedText = "", streamedThinking = "", inputTokens = null, outputTokens = null, stopReason = null;
  for await (const event of await client.messages.create({ ...request, stream: true })) {
    events.push(event.type);
    if (event.type === "message_start") inputTokens = event.message.usage?.input_tokens;
    if (event.type === "content_block_delta" && event.delta.type === "text_delta") streamedText += event.delta.text;
    if (event.type === "content_block_delta" && event.delta.type === "thinking_delta") streamedThinking += event.delta.thinking;
    if (event.type === "message_delta") {
      stopReason = event.delta.stop_reason;
      outputTokens = event.usage?.output_tokens;
    }
  }
  check(events[0] === "message_start", `stream: first event is ${show(events[0])}, expected message_start`);
  check(events.at(-1) === "message_stop", `stream: last event is ${show(events.at(-1))}, expected message_stop`);
  check(events.at(-2) === "message_delta", `stream: message_delta does not come just before message_stop: ${show(events)}`);
  check(streamedText === text, `stream: joined text deltas ${show(streamedText)} differ from the plain reply ${show(text)}`);
  check(streamedThinking === thinking, `stream: joined thinking deltas ${show(streamedThinking)} differ from the plain reply ${show(thinking)}`);
  check(stopReason === reply.stop_reason, `stream: stop_reason ${show(stopReason)}, plain reply ${show(reply.stop_reason)}`);
  check(inputTokens === usage.input_tokens, `stream: message_start input_tokens ${show(inputTokens)}, plain reply ${usage.input_tokens}`);
  check(outputTokens === usage.output_tokens, `stream: message_delta output_tokens ${show(outputTokens)}, plain reply ${usage.output_tokens}`);

  // The SDK's own stream helper assembles the same message from the events.
  const assembled = await client.messages.stream(request).finalMessage();
  const helper = joinBlocks(assembled.content, "messages.stream");
  check(helper.text === text && helper.thinking === thinking,
        `messages.stream: final message ${show(helper)} differs from the plain reply ${show({ text, thinking })}`);
  check(assembled.stop_reason === reply.stop_reason, `messages.stream: stop_reason ${show(assembled.stop_reason)}`);
  return { text, thinking, stop_reason: reply.stop_reason, usage, events: events.length };
}

async function checkErrors(model) {
  const badRole = await expectApiError(
      () => client.messages.create({ model, max_tokens: 4, messages: [{ role: "wizard", content: "hi" }] }),
      Anthropic.BadRequestError, 400, "unknown role");
  check(badRole.error.error.type === "invalid_request_error", `unknown role: error type ${show(badRole.error.error.type)}`);
  const noMessages = await expectApiError(
      () => client.messages.create({ model, max_tokens: 4, messages: [] }),
      Anthropic.BadRequestError, 400, "empty messages");
  const result = { bad_role: badRole.error.error.message, no_messages: noMessages.error.error.message };
  if (apiKey) {
    const denied = await expectApiError(
        () => makeClient(`${apiKey}-wrong`).messages.create({ model, max_tokens: 4, messages: [{ role: "user", content: "hi" }] }),
        Anthropic.AuthenticationError, 401, "wrong api key");
    result.wrong_key = denied.error.error.message;
  } else {
    result.wrong_key = "skipped: no API key given";
  }
  return result;
}

let step = "GET /v1/models";
try {
  const model = await servedModel();
  const results = { ok: true, client: `@anthropic-ai/sdk ${VERSION}`, model };
  step = "messages";
  results.messages = await checkMessages(model);
  step = "error cases";
  results.errors = await checkErrors(model);
  console.log(JSON.stringify(results));
} catch (err) {
  const what = err instanceof CheckFailed ? err.message
             : err instanceof Anthropic.APIError ? `${step}: the client threw ${err.constructor.name} (status ${err.status}): ${err.message}`
             : `${step}: unexpected ${err?.constructor?.name}: ${err?.stack ?? err}`;
  console.log(JSON.stringify({ ok: false, failed: what }));
  console.error(`e2e_anthropic: FAILED: ${what}`);
  process.exit(1);
}
