// End-to-end check of tool calls through the official npm clients `openai` and
// `@anthropic-ai/sdk` (tools/server/fetch installs both). A small model will not call a tool when
// asked, so the server under test must answer every request with this fixed model output (the
// fake-output test hook of lode's engine worker, set by tests/test_server_npm.cpp):
//
//   The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n
//   <parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>
//
// Everything between that text and the clients is real: the template's tool prompt, the output
// parser, the OpenAI and Anthropic response and stream formats, and the clients' own parsing.
//
//   node tools/server/e2e_tools.mjs BASE_URL [API_KEY]
//
// Prints one JSON line of results; exits 1 at the first failed check, saying which.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const [baseUrl, keyArg] = process.argv.slice(2);
if (!baseUrl) {
  console.error("usage: node e2e_tools.mjs BASE_URL [API_KEY]");
  process.exit(2);
}
const root = baseUrl.replace(/\/$/, "");
const apiKey = keyArg ?? process.env.LODE_API_KEY ?? "no-key";
const openai = new OpenAI({ baseURL: `${root}/v1`, apiKey, maxRetries: 0, timeout: 60_000 });
const anthropic = new Anthropic({ baseURL: root, apiKey, maxRetries: 0, timeout: 60_000 });

class CheckFailed extends Error {}
function check(condition, what) {
  if (!condition) throw new CheckFailed(what);
}
const show = (v) => JSON.stringify(v);
const expectedArguments = { city: "Paris", days: 3 };  // days typed by the tool's schema
const sameArguments = (a) => show(a) === show(expectedArguments);

const weatherParameters = {
  type: "object",
  properties: { city: { type: "string" }, days: { type: "integer" } },
  required: ["city"],
};
const question = "What is the weather in Paris for the next 3 days?";

async function openaiToolCall() {
  const request = {
    messages: [{ role: "user", content: question }],
    tools: [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: weatherParameters } }],
    max_tokens: 64,
  };
  const reply = await openai.chat.completions.create(request);
  const [choice] = reply.choices;
  check(choice.finish_reason === "tool_calls", `openai: finish_reason ${show(choice.finish_reason)}`);
  check(choice.message.reasoning_content === "The user wants the weather.",
        `openai: reasoning_content ${show(choice.message.reasoning_content)}`);
  const calls = choice.message.tool_calls ?? [];
  check(calls.length === 1, `openai: ${calls.length} tool calls`);
  check(calls[0].type === "function" && calls[0].function.name === "get_weather", `openai: call ${show(calls[0])}`);
  check(typeof calls[0].id === "string" && calls[0].id.length > 0, "openai: the call has no id");
  check(sameArguments(JSON.parse(calls[0].function.arguments)), `openai: arguments ${calls[0].function.arguments}`);

  // Streamed: the client's own accumulation of tool-call deltas.
  const stream = openai.chat.completions.stream({ ...request, stream: true });
  const final = await stream.finalChatCompletion();
  const streamedCalls = final.choices[0].message.tool_calls ?? [];
  check(final.choices[0].finish_reason === "tool_calls", `openai stream: finish_reason ${show(final.choices[0].finish_reason)}`);
  check(streamedCalls.length === 1 && streamedCalls[0].function.name === "get_weather",
        `openai stream: calls ${show(streamedCalls)}`);
  check(sameArguments(JSON.parse(streamedCalls[0].function.arguments)), `openai stream: arguments ${streamedCalls[0].function.arguments}`);

  // The tool's result goes back as a tool message; the request must be accepted.
  const followUp = await openai.chat.completions.create({
    ...request,
    messages: [...request.messages, choice.message,
               { role: "tool", tool_call_id: calls[0].id, content: "Sunny, 21 C" }],
  });
  check(followUp.choices.length === 1, "openai: the follow-up with the tool result failed");
  return calls[0].function.name;
}

async function anthropicToolUse(model) {
  const request = {
    model,
    max_tokens: 64,
    messages: [{ role: "user", content: question }],
    tools: [{ name: "get_weather", description: "Weather for a city", input_schema: weatherParameters }],
  };
  const reply = await anthropic.messages.create(request);
  check(reply.stop_reason === "tool_use", `anthropic: stop_reason ${show(reply.stop_reason)}`);
  const uses = reply.content.filter((b) => b.type === "tool_use");
  check(uses.length === 1 && uses[0].name === "get_weather", `anthropic: content ${show(reply.content)}`);
  check(sameArguments(uses[0].input), `anthropic: input ${show(uses[0].input)}`);

  // Streamed: the SDK joins the input_json_delta events into the block's input.
  const final = await anthropic.messages.stream(request).finalMessage();
  const streamed = final.content.filter((b) => b.type === "tool_use");
  check(final.stop_reason === "tool_use", `anthropic stream: stop_reason ${show(final.stop_reason)}`);
  check(streamed.length === 1 && sameArguments(streamed[0].input), `anthropic stream: content ${show(final.content)}`);

  const followUp = await anthropic.messages.create({
    ...request,
    messages: [...request.messages, { role: "assistant", content: reply.content },
               { role: "user", content: [{ type: "tool_result", tool_use_id: uses[0].id, content: "Sunny, 21 C" }] }],
  });
  check(followUp.content.length >= 1, "anthropic: the follow-up with the tool result failed");
  return uses[0].name;
}

try {
  const model = (await openai.models.list()).data[0].id;
  const results = { model, openai: await openaiToolCall(), anthropic: await anthropicToolUse(model) };
  console.log(JSON.stringify({ ok: true, ...results }));
} catch (err) {
  console.error(err instanceof CheckFailed ? `check failed: ${err.message}` : err);
  process.exit(1);
}
