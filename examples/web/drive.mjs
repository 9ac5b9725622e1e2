#!/usr/bin/env node
// Drives the page in a real headless Chromium (puppeteer-core, the browser installed on this
// machine) and prints what it translated as JSON: what tests/runtime/test_web_page.py compares
// with the Python runtime, and how docs/results.md's browser timings were taken.
//
//   node examples/web/drive.mjs PAGE_URL --chromium PATH [--lines FILE.json] [--beams 1,4] [--batch 1,16]
//       [--threads N] [--type FILE.json --type-beam K] [--time] [--screenshot FILE.png]
//
// --lines: a JSON list of lines, translated by the page's translator at each beam and each --batch
//   (sentences per decoder call; default 1), printed as {translations: {batch: {beam: lines}}};
// --type: lines typed into the text box and translated with its button, as a person would;
// --time: each line of --lines alone, timed (ms per sentence, after one line to warm up);
// --screenshot: the page as it stands at the end.

import { readFileSync } from "node:fs";

import puppeteer from "puppeteer-core";

const USAGE = "usage: node drive.mjs PAGE_URL --chromium PATH [--lines F] [--beams 1,4] [--batch 1,16] [--threads N] [--type F --type-beam K] [--time] [--screenshot F]";

function parse(argv) {
  const options = { beams: "1,4", batch: "1", "type-beam": "4" }, flags = new Set(["time"]);
  const positional = [];
  for (let i = 0; i < argv.length; i++) {
    if (!argv[i].startsWith("--")) positional.push(argv[i]);
    else if (flags.has(argv[i].slice(2))) options[argv[i].slice(2)] = true;
    else options[argv[i].slice(2)] = argv[++i];
  }
  if (positional.length !== 1 || !options.chromium) throw new Error(USAGE);
  return { url: positional[0], ...options };
}

async function main(argv) {
  const options = parse(argv);
  const url = new URL(options.url);
  if (options.threads) url.searchParams.set("threads", options.threads);
  const browser = await puppeteer.launch({
    executablePath: options.chromium,
    headless: true,
    // --no-sandbox: Chromium's sandbox refuses to run as root, as CI does here.
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-extensions"],
  });
  const result = {};
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1100, height: 400 });
    const errors = [];
    page.on("pageerror", (error) => errors.push(error.message));
    page.on("console", (message) => { if (message.type() === "error") errors.push(message.text()); });
    const start = Date.now();
    await page.goto(url.href, { waitUntil: "load" });
    try {
      result.settings = await page.evaluate(async () => (await window.translator).settings);
    } catch (error) {
      throw new Error(`the page did not open its package: ${await page.$eval("#status", (e) => e.textContent)} ${errors.join(" / ")}`);
    }
    result.open_s = (Date.now() - start) / 1000;
    if (options.lines) {
      const lines = JSON.parse(readFileSync(options.lines, "utf8"));
      result.translations = {};  // {batch: {beam: lines}}
      for (const batch of options.batch.split(",").map(Number)) {
        result.translations[batch] = {};
        for (const beam of options.beams.split(",").map(Number)) {
          result.translations[batch][beam] = await page.evaluate(
            async (lines, beam, batch) => (await window.translator).translate(lines, { beam, batch }), lines, beam, batch);
        }
      }
      if (options.time) {
        result.ms_per_sentence = {};
        for (const beam of options.beams.split(",").map(Number)) {
          result.ms_per_sentence[beam] = await page.evaluate(async (lines, beam) => {
            const translator = await window.translator;
            const sentences = lines.filter((line) => line.trim() !== "");
            await translator.translate(sentences.slice(0, 1), { beam });  // warm up
            const start = performance.now();
            for (const line of sentences) await translator.translate([line], { beam });
            return (performance.now() - start) / sentences.length;
          }, lines, beam);
        }
      }
    }
    if (options.type) {
      const lines = JSON.parse(readFileSync(options.type, "utf8"));
      await page.$eval("#source", (e) => { e.value = ""; });
      await page.type("#source", lines.join("\n"));
      await page.select("#beam", options["type-beam"]);
      await page.click("#translate");
      await page.waitForFunction(() => /sentences? in|failed/.test(document.getElementById("status").textContent), { timeout: 120_000 });
      result.typed = await page.$eval("#target", (e) => e.value.split("\n"));
      result.status = await page.$eval("#status", (e) => e.textContent);
    }
    if (options.screenshot) await page.screenshot({ path: options.screenshot });
    if (errors.length) result.errors = errors;
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + "\n");
}

main(process.argv.slice(2)).catch((error) => {
  process.stderr.write(`drive.mjs: ${error.message}\n`);
  process.exitCode = 1;
});
