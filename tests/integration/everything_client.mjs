// A TypeScript SDK client of the gateway with server-everything behind it (see test_everything.py).
//
//   node everything_client.mjs URL      (bearer token, if any, in MANIFOLD_TOKEN)
//
// Connects over streamable HTTP (2025 era), declares sampling and elicitation, lists prompts,
// resources and templates, gets a prompt, reads a resource, and calls trigger-sampling-request,
// answering the sampling request itself. Prints one JSON summary line on stdout; exits non-zero
// (with the error on stderr) on any failure.

import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

// The SDK lives in tests/thirdparty/node_modules, outside this file's resolution path.
const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "thirdparty", "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { CreateMessageRequestSchema, ElicitRequestSchema } = require("@modelcontextprotocol/sdk/types.js");

const url = process.argv[2];
if (!url) {
  console.error("usage: node everything_client.mjs URL");
  process.exit(2);
}
const token = process.env.MANIFOLD_TOKEN;
const headers = token ? { Authorization: `Bearer ${token}` } : {};

async function all(list, key) {
  const items = [];
  let cursor;
  do {
    const page = await list(cursor ? { cursor } : undefined);
    items.push(...page[key]);
    cursor = page.nextCursor;
  } while (cursor);
  return items;
}

async function main() {
  const client = new Client(
    { name: "manifold-ts-check", version: "1.0.0" },
    { capabilities: { sampling: {}, elicitation: {} } },
  );
  let samplingMeta = null;
  client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
    samplingMeta = request.params._meta ?? null;
    const asked = request.params.messages.map((m) => m.content.text).join(" ");
    return {
      role: "assistant",
      content: { type: "text", text: `typescript sampled this: ${asked}` },
      model: "ts-model",
      stopReason: "endTurn",
    };
  });
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: "decline" }));

  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport);
  try {
    const prompts = await all((c) => client.listPrompts(c), "prompts");
    const resources = await all((c) => client.listResources(c), "resources");
    const templates = await all((c) => client.listResourceTemplates(c), "resourceTemplates");
    const prompt = await client.getPrompt({
      name: "everything__args-prompt",
      arguments: { city: "Nantes", state: "Loire" },
    });
    const uri = "demo://resource/static/document/features.md";
    const read = await client.readResource({ uri });
    const sampled = await client.callTool(
      { name: "everything__trigger-sampling-request", arguments: { prompt: "ping from typescript", maxTokens: 20 } },
      undefined,
      { timeout: 30000 },
    );
    const summary = {
      protocolVersion: transport.protocolVersion ?? null,
      server: client.getServerVersion() ?? null,
      prompts: prompts.map((p) => p.name),
      resources: resources.map((r) => r.uri),
      templates: templates.map((t) => t.uriTemplate),
      prompt: { text: prompt.messages[0].content.text, server: prompt._meta?.["manifold/server"] ?? null },
      read: { uri: read.contents[0].uri, chars: read.contents[0].text.length },
      samplingMeta,
      sampling: {
        isError: sampled.isError ?? false,
        text: sampled.content.map((c) => c.text ?? "").join("\n"),
      },
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
