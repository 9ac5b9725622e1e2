// The page's controls: the package named by ?package= (default: serve.py's /package/), wasm threads
// by ?threads= (default 1: the fastest measured, docs/results.md; more only where the page is
// cross-origin isolated). Each line of the text box is one sentence, translated as `pipeline translate` would:
// normalized as its training corpus was, then one line out per line in.
// window.translator (a promise of the WebTranslator) is there for scripts that drive the page.

import { WebTranslator } from "./web-translator.mjs";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const threads = Math.max(1, Math.trunc(Number(params.get("threads") ?? 1)) || 1);

// Python's str.isspace() characters (see search.mjs's BLANK) and pipeline translate's normalize:
// NFC, control characters to spaces, runs of whitespace to one space, stripped.
const SPACES = /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/g;
const normalize = (line) => line.normalize("NFC").replace(/[\x00-\x1f\x7f-\x9f]/g, " ").replace(SPACES, " ").trim();

function show(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

window.translator = WebTranslator.open(params.get("package") ?? "/package/", { threads, onProgress: show });
window.translator.then((t) => {
  const { variant, src_lang: src, tgt_lang: tgt } = t.about;
  const { threads: used, crossOriginIsolated } = t.settings;
  const languages = src && tgt ? `${src} → ${tgt}, ` : "";
  $("about").textContent = `${languages}${variant ?? "a package"}; onnxruntime-web (wasm SIMD, ` +
    `${used} thread${used === 1 ? "" : "s"}${crossOriginIsolated ? "" : ": not cross-origin isolated"})`;
  $("translate").disabled = false;
  show("ready");
}, (error) => show(`The package could not be opened: ${error.message}`, true));

$("translate").addEventListener("click", async () => {
  const translator = await window.translator;
  const lines = $("source").value.split("\n").map(normalize);
  $("translate").disabled = true;
  show("translating…");
  try {
    const start = performance.now();
    const out = await translator.translate(lines, { beam: Number($("beam").value) });
    const seconds = (performance.now() - start) / 1000;
    $("target").value = out.join("\n");
    const n = lines.filter((line) => line !== "").length;
    show(`${n} sentence${n === 1 ? "" : "s"} in ${seconds.toFixed(2)} s`);
  } catch (error) {
    show(`Translation failed: ${error.message}`, true);
  } finally {
    $("translate").disabled = false;
  }
});
