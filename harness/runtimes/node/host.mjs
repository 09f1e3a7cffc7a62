// One long-lived Node.js process that runs ONNX files for a worker: onnxruntime-node (native CPU
// provider) or onnxruntime-web (WebAssembly backend), as an application using them does.
//
//   node host.mjs node|web MODULES_DIR
//
// Protocol over stdin/stdout, one request at a time, each message a frame:
//   uint32 LE header length | header (UTF-8 JSON: names, types, dims, byte lengths) | raw tensor bytes
// Tensors travel as their little-endian bytes, never as JSON number lists. Requests (`op`):
//   hello                           -> {node, ort, backend}
//   load {model, threads, external} -> {sid, input_names, output_names}
//   run {sid, feeds}                -> {outputs: [{name, type, dims, nbytes}], ms} + bytes
//   bind {sid, feeds}               -> {}          (the feeds a `timed` call reuses)
//   timed {sid}                     -> {ms}        (performance.now() around one session.run)
//   release {sid}                   -> {}
// A failure is {error, where}. stdout carries only frames: console output goes to stderr.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";

console.log = console.info = console.debug = console.warn = console.error;

const [backend, modulesDir] = process.argv.slice(2);
const pkg = backend === "web" ? "onnxruntime-web" : "onnxruntime-node";
const require = createRequire(path.join(modulesDir, "package.json"));
const ort = require(pkg);
const ortVersion = JSON.parse(readFileSync(path.join(modulesDir, "node_modules", pkg, "package.json"), "utf8")).version;

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array,
  int16: Int16Array, uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array,
  int64: BigInt64Array, uint64: BigUint64Array, bool: Uint8Array,
  float16: Uint16Array,   // IEEE half bits; onnxruntime-common accepts Uint16Array for float16
};

const sessions = new Map();
let nextId = 1;

function tensorsFrom(feeds, payload) {
  const out = {};
  let offset = 0;
  for (const f of feeds) {
    const Arr = ARRAYS[f.type];
    if (!Arr) throw new Error(`input ${f.name}: element type ${f.type} is not passed to ${pkg}`);
    // slice() copies into a fresh, aligned ArrayBuffer
    const bytes = payload.buffer.slice(payload.byteOffset + offset, payload.byteOffset + offset + f.nbytes);
    offset += f.nbytes;
    out[f.name] = new ort.Tensor(f.type, new Arr(bytes), f.dims);
  }
  return out;
}

function describe(name, t) {
  if (t.type === "string") throw new Error(`output ${name}: string tensors are not read back`);
  const d = t.data;
  return [{ name, type: t.type, dims: Array.from(t.dims), nbytes: d.byteLength },
          Buffer.from(d.buffer, d.byteOffset, d.byteLength)];
}

async function handle(req, payload) {
  switch (req.op) {
    case "hello":
      return [{ node: process.version, ort: ortVersion, backend }];
    case "load": {
      const options = { graphOptimizationLevel: "all" };
      if (backend === "web") {
        ort.env.wasm.numThreads = req.threads || 1;
        ort.env.wasm.proxy = false;
        options.executionProviders = ["wasm"];
        if (req.external && req.external.length) {
          options.externalData = req.external.map((p) => ({ path: p, data: readFileSync(path.join(path.dirname(req.model), p)) }));
        }
      } else {
        options.executionProviders = ["cpu"];
        if (req.threads) { options.intraOpNumThreads = req.threads; options.interOpNumThreads = 1; }
      }
      // onnxruntime-web reads a buffer (as a page fetches the file); onnxruntime-node the path.
      const model = backend === "web" ? readFileSync(req.model) : req.model;
      const session = await ort.InferenceSession.create(model, options);
      const sid = nextId++;
      sessions.set(sid, { session, bound: null });
      return [{ sid, input_names: session.inputNames, output_names: session.outputNames }];
    }
    case "run": {
      const { session } = sessions.get(req.sid);
      const feeds = tensorsFrom(req.feeds, payload);
      const t0 = performance.now();
      const results = await session.run(feeds);
      const ms = performance.now() - t0;
      const heads = [], bufs = [];
      for (const name of session.outputNames) {
        const [h, b] = describe(name, results[name]);
        heads.push(h); bufs.push(b);
      }
      return [{ outputs: heads, ms }, Buffer.concat(bufs)];
    }
    case "bind": {
      sessions.get(req.sid).bound = tensorsFrom(req.feeds, payload);
      return [{}];
    }
    case "timed": {
      const s = sessions.get(req.sid);
      const t0 = performance.now();
      await s.session.run(s.bound);
      return [{ ms: performance.now() - t0 }];
    }
    case "release": {
      const s = sessions.get(req.sid);
      sessions.delete(req.sid);
      if (s) await s.session.release();
      return [{}];
    }
    default:
      throw new Error(`unknown request ${req.op}`);
  }
}

function send(header, payload = Buffer.alloc(0)) {
  const head = Buffer.from(JSON.stringify(header), "utf8");
  const len = Buffer.alloc(4);
  len.writeUInt32LE(head.length, 0);
  process.stdout.write(Buffer.concat([len, head, payload]));
}

// -- framing: read a header, then the payload its byte lengths announce --
let pending = Buffer.alloc(0);
let busy = false;

async function pump() {
  if (busy) return;
  busy = true;
  try {
    while (pending.length >= 4) {
      const hlen = pending.readUInt32LE(0);
      if (pending.length < 4 + hlen) break;
      const req = JSON.parse(pending.subarray(4, 4 + hlen).toString("utf8"));
      const plen = (req.feeds || []).reduce((a, f) => a + f.nbytes, 0);
      if (pending.length < 4 + hlen + plen) break;
      const payload = Buffer.from(pending.subarray(4 + hlen, 4 + hlen + plen));
      pending = pending.subarray(4 + hlen + plen);
      try {
        const [header, bytes] = await handle(req, payload);
        send(header, bytes);
      } catch (err) {
        send({ error: String(err && err.message ? err.message : err), where: req.op });
      }
    }
  } finally {
    busy = false;
  }
}

process.stdin.on("data", (chunk) => { pending = Buffer.concat([pending, chunk]); pump(); });
process.stdin.on("end", () => process.exit(0));   // the worker is gone: so is its host
