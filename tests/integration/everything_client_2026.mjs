// A TypeScript SDK v2 client (`@modelcontextprotocol/client`, MCP 2026-07-28) of the gateway with
// server-everything behind it (see test_typescript_2026.py).
//
//   node everything_client_2026.mjs URL      (bearer token, if any, in MANIFOLD_TOKEN)
//
// Connects pinned to 2026-07-28 (sessionless, a `_meta` envelope on every request), declares sampling and
// elicitation with handlers, lists prompts, resources and templates, gets two prompts, reads a static and a
// templated resource, completes a prompt argument, calls echo, and calls trigger-sampling-request and
// trigger-elicitation-request twice each: once letting the SDK drive the `input_required` rounds through the
// handlers, once in manual mode (`allowInputRequired`) so the rounds themselves, and their `_meta`, are seen.
// Prints one JSON summary line on stdout; exits non-zero (with the error on stderr) on any failure.

import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

// The SDK lives in tests/thirdparty/node_modules, outside this file's resolution path.
const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "thirdparty", "package.json"));
const { Client, StreamableHTTPClientTransport } = require("@modelcontextprotocol/client");

const MODERN = "2026-07-28";
const url = process.argv[2];
if (!url) {
  console.error("usage: node everything_client_2026.mjs URL");
  process.exit(2);
}
const token = process.env.MANIFOLD_TOKEN;
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const CALL = { timeout: 30000 };

// --- what the user answers: one function per kind of request, used by the handlers and by the manual rounds ---

const asked = { sampling: [], elicitation: [] }; // every request the handlers answered, in order

function sample(params, via) {
  const question = params.messages.map((m) => m.content?.text ?? "").join(" ");
  asked.sampling.push({
    via,
    meta: params._meta ?? null,
    systemPrompt: params.systemPrompt ?? null,
    maxTokens: params.maxTokens ?? null,
    question,
  });
  return {
    role: "assistant",
    content: { type: "text", text: `ts2026 ${via} answer to: ${question}` },
    model: `ts2026-model-${via}`,
    stopReason: "endTurn",
  };
}

function elicit(params, via) {
  asked.elicitation.push({
    via,
    meta: params._meta ?? null,
    message: params.message ?? null,
    required: params.requestedSchema?.required ?? null,
  });
  return { action: "accept", content: { name: `Grace Hopper (${via})`, check: true, integer: 7 } };
}

const ANSWER = { "sampling/createMessage": sample, "elicitation/create": elicit };

function text(result) {
  return (result.content ?? []).map((c) => c.text ?? "").join("\n");
}

function toolResult(result) {
  return { isError: result.isError ?? false, text: text(result), meta: result._meta ?? null };
}

/** A tool call whose `input_required` rounds this code sees and answers itself, retrying until complete. */
async function manualCall(client, name, args) {
  const rounds = [];
  let params = { name, arguments: args };
  for (let round = 0; round < 5; round++) {
    const result = await client.callTool(params, { ...CALL, allowInputRequired: true });
    if (result.resultType !== "input_required") return { rounds, result: toolResult(result) };
    const requests = result.inputRequests ?? {};
    rounds.push({
      meta: result._meta ?? null,
      methods: Object.values(requests).map((r) => r.method),
      requestState: typeof result.requestState === "string",
    });
    const inputResponses = {};
    for (const [key, request] of Object.entries(requests)) {
      inputResponses[key] = ANSWER[request.method](request.params ?? {}, "manual");
    }
    params = { name, arguments: args, inputResponses, requestState: result.requestState };
  }
  throw new Error(`${name}: still input_required after 5 rounds`);
}

async function main() {
  const client = new Client(
    { name: "manifold-ts2026-check", version: "1.0.0" },
    {
      capabilities: { sampling: {}, elicitation: {} },
      versionNegotiation: { mode: { pin: MODERN } },
    },
  );
  client.setRequestHandler("sampling/createMessage", async (request) => sample(request.params, "handler"));
  client.setRequestHandler("elicitation/create", async (request) => elicit(request.params, "handler"));

  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport);
  try {
    const prompts = await client.listPrompts();
    const resources = await client.listResources();
    const templates = await client.listResourceTemplates();
    const simple = await client.getPrompt({ name: "everything__simple-prompt" });
    const args = await client.getPrompt({
      name: "everything__args-prompt",
      arguments: { city: "Nantes", state: "Loire" },
    });
    const staticRead = await client.readResource({ uri: "demo://resource/static/document/features.md" });
    const templateRead = await client.readResource({ uri: "demo://resource/dynamic/text/1" });
    const completion = await client.complete({
      ref: { type: "ref/prompt", name: "everything__completable-prompt" },
      argument: { name: "department", value: "Eng" },
    });
    const echo = await client.callTool({ name: "everything__echo", arguments: { message: "hello from v2" } }, CALL);
    const sampled = await client.callTool(
      { name: "everything__trigger-sampling-request", arguments: { prompt: "ping from ts2026", maxTokens: 20 } },
      CALL,
    );
    const elicited = await client.callTool({ name: "everything__trigger-elicitation-request", arguments: {} }, CALL);
    const manualSampling = await manualCall(client, "everything__trigger-sampling-request", {
      prompt: "manual ping from ts2026",
      maxTokens: 20,
    });
    const manualElicitation = await manualCall(client, "everything__trigger-elicitation-request", {});

    const discover = client.getDiscoverResult();
    const summary = {
      era: client.getProtocolEra() ?? null,
      protocolVersion: client.getNegotiatedProtocolVersion() ?? null,
      server: client.getServerVersion() ?? null,
      discoverVersions: discover?.supportedVersions ?? null,
      prompts: prompts.prompts.map((p) => p.name),
      resources: resources.resources.map((r) => r.uri),
      templates: templates.resourceTemplates.map((t) => t.uriTemplate),
      simplePrompt: { messages: simple.messages, meta: simple._meta ?? null },
      argsPrompt: { messages: args.messages, meta: args._meta ?? null },
      staticRead: { contents: staticRead.contents, meta: staticRead._meta ?? null },
      templateRead: { contents: templateRead.contents, meta: templateRead._meta ?? null },
      completion: { completion: completion.completion, meta: completion._meta ?? null },
      echo: toolResult(echo),
      sampling: toolResult(sampled),
      elicitation: toolResult(elicited),
      manualSampling,
      manualElicitation,
      asked,
    };
    console.log(JSON.stringify(summary));
  } finally {
    await client.close();
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error?.stack ?? String(error));
    process.exit(1);
  },
);
