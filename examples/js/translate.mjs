#!/usr/bin/env node
// A translation client for mt-onnx-package/2 packages in Node.js, written from
// docs/package-format.md alone: it checks the package's files, opens its step graphs (encoder.onnx,
// decoder.onnx) with onnxruntime-node and searches with search.mjs (greedy and beam search, the
// shortlist's rules), the module that examples/web's page shares.
//
//   node translate.mjs PACKAGE_DIR [--beam K] [--batch N] [--threads T] [--length-penalty P] < in > out
//
// As a library: const t = await Translator.open(dir); await t.translate(lines, { beam: 4 }).
// Section names in the comments ("## ...") are the spec's.

import { createHash } from "node:crypto";
import { createReadStream, lstatSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { inflateRawSync } from "node:zlib";

import { Tokenizer } from "@huggingface/tokenizers";
import ort from "onnxruntime-node";

import { readNpz } from "./npz.mjs";
import { checkManifest, PackageSearch, usesShortlist } from "./search.mjs";

// ## package.json: refuse an unknown major version, a folder holding anything but folders and
// regular files, and any listed file whose size or sha256 differs; all before opening a graph.
export async function checkPackage(dir) {
  const about = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
  const files = checkManifest(about, dir);
  const walk = (folder) => {
    for (const name of readdirSync(folder)) {
      const stat = lstatSync(path.join(folder, name));
      if (stat.isDirectory()) walk(path.join(folder, name));
      else if (!stat.isFile()) throw new Error(`${path.join(folder, name)}: neither a folder nor a regular file`);
    }
  };
  walk(dir);
  for (const [name, want] of Object.entries(files)) {
    const full = path.resolve(dir, name);
    if (!full.startsWith(path.resolve(dir) + path.sep)) throw new Error(`${dir}: bad path ${name}`);
    const stat = lstatSync(full, { throwIfNoEntry: false });
    if (!stat?.isFile() || stat.size !== want.bytes) throw new Error(`${full}: missing or not ${want.bytes} bytes`);
    const hash = createHash("sha256");
    for await (const chunk of createReadStream(full)) hash.update(chunk);
    if (hash.digest("hex") !== want.sha256) throw new Error(`${full}: sha256 differs from package.json's`);
  }
  return about;
}

export class Translator extends PackageSearch {
  /** Check the package (checkPackage), then load its tokenizer, step graphs and shortlist. */
  static async open(dir, { threads = 1 } = {}) {
    const about = await checkPackage(dir);
    const read = (name) => readFileSync(path.join(dir, name));
    const options = { executionProviders: ["cpu"], intraOpNumThreads: threads, interOpNumThreads: 1 };
    const translator = new Translator({
      gen: JSON.parse(read("generation.json").toString("utf8")),
      tokenizer: new Tokenizer(JSON.parse(read("tokenizer.json").toString("utf8")), { clean_up_tokenization_spaces: false }),
      encoder: await ort.InferenceSession.create(path.join(dir, "encoder.onnx"), options),
      decoder: await ort.InferenceSession.create(path.join(dir, "decoder.onnx"), options),
      // ## decoder_batch.onnx (CPU packages): beam search gets the search op's numbers to the bit.
      beams: "decoder_batch.onnx" in about.files ? await ort.InferenceSession.create(path.join(dir, "decoder_batch.onnx"), options) : null,
      Tensor: ort.Tensor,
      // ## The shortlist: packages that list shortlist.onnx (int8 ones made with a shortlist)
      // search with shortlist.npz; float32 packages carry shortlist.npz but search the whole vocabulary.
      shortlist: usesShortlist(about) ? await readNpz(read("shortlist.npz"), inflateRawSync, path.join(dir, "shortlist.npz")) : null,
      where: dir,
    });
    translator.about = about;
    return translator;
  }
}

// The command line: one line in, one line out.
const USAGE = "usage: node translate.mjs PACKAGE_DIR [--beam K] [--batch N] [--threads T] [--length-penalty P] < in > out\n";

async function main(argv) {
  const options = { beam: undefined, batch: 1, threads: 1, "length-penalty": undefined };
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i].replace(/^--/, "");
    if (argv[i].startsWith("--") && flag in options) options[flag] = Number(argv[++i]);
    else positional.push(argv[i]);
  }
  const counts = [options.beam ?? 1, options.batch, options.threads];
  const penalty = options["length-penalty"];
  if (positional.length !== 1 || !counts.every((v) => Number.isInteger(v) && v >= 1) || Number.isNaN(penalty)) {
    process.stderr.write(USAGE);
    return 2;
  }
  const translator = await Translator.open(positional[0], { threads: options.threads });
  let text = "";
  for await (const chunk of process.stdin.setEncoding("utf8")) text += chunk;
  const lines = text.split("\n");  // a line ends at \n only (a \r stays in it)
  if (lines.at(-1) === "") lines.pop();
  const out = await translator.translate(lines, {
    beam: options.beam ?? translator.gen.beam, lengthPenalty: penalty ?? translator.gen.length_penalty, batch: options.batch,
  });
  process.stdout.write(out.map((line) => line + "\n").join(""));
  return 0;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then((code) => { process.exitCode = code; }, (error) => {
    process.stderr.write(`translate.mjs: ${error.message}\n`);
    process.exitCode = 1;
  });
}
