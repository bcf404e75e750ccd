// llama.cpp for the tests, through node-llama-cpp: one process, requests on stdin.
//
// Each line of stdin is a JSON request, answered by one JSON line on stdout:
//   {"op": "load", "path": P}            -> {"logs": [[level, message], ...]}
//   {"op": "logits", "tokens": [...]}    -> {"logits": [[...vocab floats], ...]} : the raw
//        next-token logits after each token, evaluated in one fresh sequence
//   {"op": "tokenize", "text": S}        -> {"tokens": [...]} (special tokens as text)
// `logs` are llama.cpp's log lines of warning level or worse while the model loaded.
// The package is found in $PRECISION_NODE_LLAMA_CPP/node_modules (see .ci/run).
import path from "node:path";
import readline from "node:readline";
import { pathToFileURL } from "node:url";

const root = process.env.PRECISION_NODE_LLAMA_CPP;
const entry = path.join(root, "node_modules", "node-llama-cpp", "dist", "index.js");
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);

let logs = [];
const worse = new Set([LlamaLogLevel.warn, LlamaLogLevel.error, LlamaLogLevel.fatal]);
const llama = await getLlama({
  gpu: false,
  build: "never",
  logLevel: LlamaLogLevel.warn,
  logger: (level, message) => {
    if (worse.has(level)) logs.push([String(level), String(message)]);
  },
});

let model = null;

async function handle(request) {
  if (request.op === "load") {
    if (model !== null) await model.dispose();
    logs = [];
    model = await llama.loadModel({ modelPath: request.path, gpuLayers: 0 });
    return { logs };
  }
  if (request.op === "tokenize") {
    return { tokens: Array.from(model.tokenize(request.text, false)) };
  }
  if (request.op === "logits") {
    const tokens = request.tokens;
    const context = await model.createContext({
      contextSize: Math.max(tokens.length + 1, 32),
      batchSize: Math.max(tokens.length, 32),
      threads: 1,
      flashAttention: false,
      // float32 keys and values: the comparison with float64 sees llama.cpp's weights,
      // not a float16 cache
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
    });
    try {
      const sequence = context.getSequence();
      const input = tokens.map((t) => [t, { generateNext: { logits: true } }]);
      const out = await sequence.controlledEvaluate(input);
      const rows = out.map((item) => {
        const row = [];
        for (const [token, logit] of item.next.logits) row[token] = logit;
        return row;
      });
      return { logits: rows };
    } finally {
      await context.dispose();
    }
  }
  throw new Error(`unknown op ${request.op}`);
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  let reply;
  try {
    reply = await handle(JSON.parse(line));
  } catch (err) {
    reply = { error: String(err && err.stack ? err.stack : err) };
  }
  process.stdout.write(JSON.stringify(reply) + "\n");
}
await llama.dispose();
