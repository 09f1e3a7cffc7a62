// Plain onnxruntime-node / onnxruntime-web (WebAssembly) run of one file, no project code:
//   node direct_node.mjs node|web MODULES_DIR MODEL.onnx IO_DIR
// IO_DIR/inputs.json lists {name, dtype, dims, file}; raw little-endian bytes in each file.
// IO_DIR/external.json lists the external data files onnxruntime-web must be handed (as a page does).
// Writes IO_DIR/outputs.json ({outputs: [{name, dtype, dims, file}]} or {stage, error}).
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const [backend, modules, model, io] = process.argv.slice(2);
const require = createRequire(path.join(modules, "package.json"));
const ort = require(backend === "web" ? "onnxruntime-web" : "onnxruntime-node");
const TYPES = { float32: ["float32", Float32Array], float64: ["float64", Float64Array], int64: ["int64", BigInt64Array],
  int32: ["int32", Int32Array], int8: ["int8", Int8Array], uint8: ["uint8", Uint8Array], bool: ["bool", Uint8Array],
  float16: ["float16", Uint16Array] };
const DTYPES = { float32: "float32", float64: "float64", int64: "int64", int32: "int32", int8: "int8", uint8: "uint8",
  bool: "bool", float16: "float16" };
const done = (obj) => writeFileSync(path.join(io, "outputs.json"), JSON.stringify(obj));

let session;
try {
  const opts = backend === "web" ? { executionProviders: ["wasm"] } : { executionProviders: ["cpu"] };
  if (backend === "web") {
    ort.env.wasm.numThreads = 1;
    const external = JSON.parse(readFileSync(path.join(io, "external.json"), "utf8"));
    if (external.length) opts.externalData = external.map((p) => ({ path: p, data: readFileSync(path.join(path.dirname(model), p)) }));
  }
  session = await ort.InferenceSession.create(backend === "web" ? readFileSync(model) : model, opts);
} catch (e) {
  done({ stage: "load", error: String(e.message || e) });
  process.exit(0);
}
try {
  const feeds = {};
  for (const i of JSON.parse(readFileSync(path.join(io, "inputs.json"), "utf8"))) {
    const [type, Arr] = TYPES[i.dtype];
    const buf = readFileSync(path.join(io, i.file));
    feeds[i.name] = new ort.Tensor(type, new Arr(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length)), i.dims);
  }
  const res = await session.run(feeds);
  const outputs = session.outputNames.map((name, k) => {
    const t = res[name];
    writeFileSync(path.join(io, `out${k}.bin`), Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    return { name, dtype: DTYPES[t.type], dims: Array.from(t.dims), file: `out${k}.bin` };
  });
  done({ outputs });
} catch (e) {
  done({ stage: "run", error: String(e.message || e) });
}
