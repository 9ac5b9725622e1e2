// A package opened in a browser: its files fetched over HTTP and checked against package.json's
// sizes and sha256 (SubtleCrypto) before any graph opens, its step graphs run by onnxruntime-web
// (WebAssembly, CPU), its search that of examples/js/search.mjs, the module the Node client uses.
// The bare imports are resolved by index.html's import map (node_modules/, served by serve.py).

import * as ort from "onnxruntime-web";
import { Tokenizer } from "@huggingface/tokenizers";

import { readNpz } from "../js/npz.mjs";
import { checkManifest, PackageSearch, usesShortlist } from "../js/search.mjs";

async function inflateRaw(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

const hex = (buffer) => Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");

/** The wasm settings in force: threads only where the page is cross-origin isolated (serve.py's headers). */
export function wasmSettings({ threads = 1 } = {}) {
  // onnxruntime-web 1.31 ships SIMD builds alone (ort-wasm-simd-threaded.*): SIMD is always on.
  // Its threads need SharedArrayBuffer, which a browser gives only to a cross-origin isolated page.
  ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? threads : 1;
  return { threads: ort.env.wasm.numThreads, simd: true, crossOriginIsolated: Boolean(globalThis.crossOriginIsolated) };
}

export class WebTranslator extends PackageSearch {
  /**
   * Fetch and check the package at `url` (a folder's URL, ending in "/"), then open it. Only the
   * files this client reads are fetched (the step graphs, not generate*.onnx or the batch
   * graphs), each checked against package.json before the first graph opens.
   */
  static async open(url, { threads = 1, onProgress = () => {} } = {}) {
    const base = new URL(url, location.href);
    const get = async (name) => {
      const response = await fetch(new URL(name, base));
      if (!response.ok) throw new Error(`${new URL(name, base)}: HTTP ${response.status}`);
      return new Uint8Array(await response.arrayBuffer());
    };
    const about = JSON.parse(new TextDecoder().decode(await get("package.json")));
    const files = checkManifest(about, base.href);
    const shortlisted = usesShortlist(about);
    const names = ["generation.json", "tokenizer.json", "encoder.onnx", "decoder.onnx", ...(shortlisted ? ["shortlist.npz"] : [])];
    const bytes = {};
    for (const name of names) {
      onProgress(`fetching ${name} (${(files[name].bytes / 1e6).toFixed(1)} MB)`);
      bytes[name] = await get(name);
      if (bytes[name].length !== files[name].bytes) throw new Error(`${name}: ${bytes[name].length} bytes, package.json says ${files[name].bytes}`);
      if (hex(await crypto.subtle.digest("SHA-256", bytes[name])) !== files[name].sha256) throw new Error(`${name}: sha256 differs from package.json's`);
    }
    const settings = wasmSettings({ threads });
    onProgress("opening the graphs");
    const json = (name) => JSON.parse(new TextDecoder().decode(bytes[name]));
    // A graph may read weights inside the other as ONNX external data (the int8 encoders read the
    // token table in decoder.onnx); onnxruntime-web keeps a reference to each file and copies
    // only what a graph reads, so both are offered to both.
    const externalData = ["encoder.onnx", "decoder.onnx"].map((path) => ({ path, data: bytes[path] }));
    const options = { executionProviders: ["wasm"], externalData };
    const translator = new WebTranslator({
      gen: json("generation.json"),
      tokenizer: new Tokenizer(json("tokenizer.json"), { clean_up_tokenization_spaces: false }),
      encoder: await ort.InferenceSession.create(bytes["encoder.onnx"], options),
      decoder: await ort.InferenceSession.create(bytes["decoder.onnx"], options),
      Tensor: ort.Tensor,
      shortlist: shortlisted ? await readNpz(bytes["shortlist.npz"], inflateRaw, "shortlist.npz") : null,
      where: base.href,
    });
    return Object.assign(translator, { about, settings });
  }
}
