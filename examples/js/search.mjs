// The part of a mt-onnx-package/2 client that is the same in Node.js and in a browser, written from
// docs/package-format.md alone: the package.json rules that need no file system, the text rules,
// the shortlist's rules and the greedy and beam search over the step graphs (encoder.onnx,
// decoder.onnx; decoder_batch.onnx for beams where it is given). It imports nothing: the caller gives it onnxruntime's sessions and Tensor class
// (onnxruntime-node or onnxruntime-web) and a tokenizer (tokenizers.js), so that examples/js
// (translate.mjs) and examples/web (the page) search with one copy of this code.
// Section names in the comments ("## ...") are the spec's.

export const FORMAT_MAJOR = 2;
export const NEEDED = ["generation.json", "tokenizer.json", "encoder.onnx", "decoder.onnx"];
// ## Text in and out: every character that ends a line in Unicode becomes a space.
export const LINE_ENDS = /[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]/g;
// A blank line: only characters that Python's str.isspace() calls whitespace (not JavaScript's
// trim(), which differs at U+001C-U+001F, U+0085 and U+FEFF). See examples/js/README.md.
export const BLANK = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

// ## package.json: an unknown major version, a missing needed file or a path that leaves the
// package is refused; the caller then checks each file's size and sha256 before opening a graph.
export function checkManifest(about, where) {
  const format = /^mt-onnx-package\/(\d+)(?:\.(\d+))?$/.exec(String(about.format));
  if (!format || Number(format[1]) !== FORMAT_MAJOR) {
    const hint = format && Number(format[1]) < FORMAT_MAJOR ? ": re-export it to get version 2" : "";
    throw new Error(`${where}: format ${JSON.stringify(about.format)}; this client reads mt-onnx-package/${FORMAT_MAJOR}${hint}`);
  }
  const files = about.files ?? {};
  for (const name of NEEDED) if (!(name in files)) throw new Error(`${where}: package.json does not list ${name}`);
  for (const name of Object.keys(files)) {
    if (name.startsWith("/") || name.split(/[\\/]/).some((part) => part === ".." || part === "")) {
      throw new Error(`${where}: bad path ${name}`);
    }
  }
  return files;
}

/** Whether the package searches with its shortlist (## The shortlist). */
export function usesShortlist(about) {
  return "shortlist.npz" in about.files && "shortlist.onnx" in about.files;
}

/** The search over a package's step graphs, given what the platform opened (see the top). */
export class PackageSearch {
  /**
   * @param parts.gen generation.json, parsed
   * @param parts.tokenizer a tokenizers.js Tokenizer of tokenizer.json
   * @param parts.encoder, parts.decoder onnxruntime InferenceSessions of encoder.onnx, decoder.onnx
   * @param parts.Tensor that onnxruntime's Tensor class
   * @param parts.shortlist shortlist.npz's arrays where the package searches with it, else null
   * @param parts.beams an InferenceSession of decoder_batch.onnx, or null: beam search then runs
   *   over it with a sentence's beams grouped in each cross-attention, as onnxruntime's BeamSearch
   *   op in generate.onnx does (## Numbers); over decoder.onnx, one row per beam, the float sums
   *   may part from the op's by an ulp
   */
  constructor({ gen, tokenizer, encoder, decoder, Tensor, shortlist = null, beams = null, where = "package" }) {
    Object.assign(this, { gen, tokenizer, encoder, decoder, Tensor });
    this.beams = beams && beams.inputNames.includes("group") ? beams : null;
    // ## The step graphs: the first step's empty cache needs each layer's [heads, head_size],
    // which decoder.onnx's past_* input shapes give as numbers.
    this.emptyPast = {};
    for (const m of decoder.inputMetadata.filter((m) => m.name.startsWith("past_"))) {
      if (m.type !== "float32") throw new Error(`${where}: ${m.name} is ${m.type}: this client runs float32 and int8 packages`);
      if (!Number.isInteger(m.shape[1]) || !Number.isInteger(m.shape[3])) throw new Error(`${where}: ${m.name}'s heads and head size are not fixed`);
      this.emptyPast[m.name] = [m.shape[1], m.shape[3]];
    }
    this.shortlist = shortlist && shortlistRules(shortlist, gen);
  }

  // ## Text in and out
  encode(line) {
    const ids = this.tokenizer.encode(line, { add_special_tokens: false }).ids;
    return [...ids.slice(0, this.gen.max_positions - 1), this.gen.eos_id];
  }

  decode(ids) {
    const { pad_id, bos_id, eos_id } = this.gen;
    const end = ids.indexOf(eos_id);
    const kept = (end < 0 ? ids : ids.slice(0, end)).filter((id) => id !== pad_id && id !== bos_id && id !== eos_id);
    if (kept.length === 0) return "";  // tokenizers.js refuses to decode no ids
    return this.tokenizer.decode(kept, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
      .replace(LINE_ENDS, " ");
  }

  /** One translation per line; `batch` sentences share each decoder call (same results at any size). */
  async translate(lines, { beam = this.gen.beam, lengthPenalty = this.gen.length_penalty, batch = 1 } = {}) {
    const out = new Array(lines.length).fill("");
    const todo = lines.map((line, i) => [i, line]).filter(([, line]) => !BLANK.test(line));
    for (let start = 0; start < todo.length; start += batch) {
      const chunk = todo.slice(start, start + batch);
      const results = await this.search(chunk.map(([, line]) => this.encode(line)), beam, lengthPenalty);
      chunk.forEach(([i], j) => { out[i] = this.decode(results[j]); });
    }
    return out;
  }

  // ## The search, for several sentences at once (## The step graphs): each sentence's rows are
  // consecutive (1 for greedy, k for beam search); a finished sentence's rows leave the next
  // step, whose cache_index names each row's parent among the previous step's rows.
  async search(sources, beam, lengthPenalty = this.gen.length_penalty) {
    const { Tensor } = this;
    const { pad_id, bos_id, max_len_a, max_len_b, max_positions } = this.gen;
    // Padded to a multiple of 4 positions within max_positions, as docs/package-format.md's "Text
    // in and out" asks of every client: then a sentence's numbers do not depend on its batch.
    const longest = Math.max(...sources.map((s) => s.length));
    const srcLen = Math.max(longest, Math.min(Math.ceil(longest / 4) * 4, max_positions));
    const srcIds = new BigInt64Array(sources.length * srcLen).fill(BigInt(pad_id));
    sources.forEach((s, b) => s.forEach((id, j) => { srcIds[b * srcLen + j] = BigInt(id); }));
    const encoded = await this.encoder.run({ src_ids: new Tensor("int64", srcIds, [sources.length, srcLen]) });

    const results = new Array(sources.length);
    const searches = sources.map((src, b) => {
      // ## The search: the length limit L, start token included
      const L = Math.max(1, Math.min(Math.trunc(max_len_a * src.length + max_len_b), max_positions - 1));
      const search = beam > 1 ? new BeamSearch(beam, L, this.gen.eos_id, lengthPenalty, this.shortlist?.outputVocabulary)
        : new GreedySearch(L, this.gen, this.shortlist?.sentenceWords(src));
      if (search.done) results[b] = search.result();  // L = 1: no token to generate
      return Object.assign(search, { b });
    });
    let live = searches.filter((s) => !s.done);
    // ## decoder_batch.onnx: with `group` k, src_mask and cross_* hold one row per sentence.
    const grouped = beam > 1 && this.beams !== null;
    const feedRows = () => (grouped ? live : live.flatMap((s) => s.beams.map(() => s)));
    let rows = live.flatMap((s) => s.beams.map(() => s));  // the sentence of each row
    let parents = rows.map((_, r) => r);
    const feeds = { ...this.rowFeeds(encoded, feedRows(), sources, srcLen), ...(grouped ? this.groupFeeds(beam) : {}) };
    for (const [name, [heads, size]] of Object.entries(this.emptyPast)) {
      feeds[name] = new Tensor("float32", new Float32Array(0), [rows.length, heads, 0, size]);
    }
    while (live.length > 0) {
      const tokens = live.flatMap((s) => s.beams.map((b) => BigInt(b.tokens.at(-1) ?? bos_id)));
      feeds.tokens = new Tensor("int64", BigInt64Array.from(tokens), [rows.length, 1]);
      feeds.cache_index = new Tensor("int64", BigInt64Array.from(parents, BigInt), [rows.length]);
      const out = await (grouped ? this.beams : this.decoder).run(feeds);
      for (const name of Object.keys(this.emptyPast)) feeds[name] = out[name.replace("past_", "present_")];
      // A row: its log-probabilities over the vocabulary, or (grouped) its best 2k as {values, ids}.
      const row = grouped
        ? (r) => { const n = out.top_ids.dims[1]; return { values: out.top_log_probs.data.subarray(r * n, (r + 1) * n), ids: out.top_ids.data.subarray(r * n, (r + 1) * n) }; }
        : (r) => out.log_probs.data.subarray(r * out.log_probs.dims[1], (r + 1) * out.log_probs.dims[1]);
      // Each sentence steps on its rows; its next rows name their parents.
      let first = 0;
      parents = [];
      for (const s of live) {
        const own = s.beams.map((_, j) => row(first + j));
        const chosen = s.step(own);  // the beam each next row continues
        if (s.done) results[s.b] = s.result();
        else parents.push(...chosen.map((j) => first + j));
        first += own.length;
      }
      if (live.some((s) => s.done)) {
        live = live.filter((s) => !s.done);
        rows = live.flatMap((s) => s.beams.map(() => s));
        Object.assign(feeds, this.rowFeeds(encoded, feedRows(), sources, srcLen));
      }
    }
    return results;
  }

  /** decoder_batch.onnx's other inputs for beam search: each row's best 2k, normalized, its
   * sentence's k beams grouped; the output vocabulary, not a greedy word list (## The shortlist). */
  groupFeeds(k) {
    const { Tensor } = this, inputs = this.beams.inputNames;
    const feeds = {
      group: new Tensor("int64", BigInt64Array.from([BigInt(k)]), [1]),
      top_k: new Tensor("int64", BigInt64Array.from([BigInt(2 * k)]), [1]),
    };
    if (inputs.includes("normalize")) feeds.normalize = new Tensor("bool", Uint8Array.from([1]), [1]);
    if (inputs.includes("shortlisted")) {
      feeds.shortlisted = new Tensor("bool", Uint8Array.from([0]), [1]);
      feeds.shortlist_weight = new Tensor("int8", new Int8Array(0), [0, 0]);
      feeds.shortlist_scale = new Tensor("float32", new Float32Array(0), [0]);
    }
    return feeds;
  }

  /** src_mask and cross_* with one copy of the sentence's rows per row of `rows` (sentences). */
  rowFeeds(encoded, rows, sources, srcLen) {
    const { Tensor } = this;
    const mask = new Uint8Array(rows.length * srcLen);  // src_ids != pad_id (a source may hold pad_id itself)
    rows.forEach((s, r) => sources[s.b].forEach((id, j) => { mask[r * srcLen + j] = id !== this.gen.pad_id; }));
    const feeds = { src_mask: new Tensor("bool", mask, [rows.length, srcLen]) };
    for (const name of this.encoder.outputNames) {
      const t = encoded[name], per = t.data.length / t.dims[0];
      const data = new Float32Array(rows.length * per);
      rows.forEach((s, r) => data.set(t.data.subarray(s.b * per, (s.b + 1) * per), r * per));
      feeds[name] = new Tensor("float32", data, [rows.length, ...t.dims.slice(1)]);
    }
    return feeds;
  }
}

// ## The search: Greedy. The word of highest log-probability, the lowest id among equal ones,
// over the whole vocabulary or over the sentence's words; stop at EOS or after L - 1 tokens.
export class GreedySearch {
  constructor(L, gen, words) {
    Object.assign(this, { L, eos: gen.eos_id, words, beams: [{ tokens: [] }], done: L - 1 <= 0 });
  }

  step([logProbs]) {
    let best = -1;
    const consider = (w) => { if (best < 0 || logProbs[w] > logProbs[best] || (logProbs[w] === logProbs[best] && w < best)) best = w; };
    if (this.words) this.words.forEach(consider); else for (let w = 0; w < logProbs.length; w++) consider(w);
    const tokens = this.beams[0].tokens;
    if (best === this.eos) this.done = true;
    else { tokens.push(best); this.done = tokens.length >= this.L - 1; }
    return [0];
  }

  result() { return this.beams[0].tokens; }
}

// ## The search: Beam search, onnxruntime's BeamSearch op with early stopping, in float32.
export class BeamSearch {
  constructor(k, L, eos, penalty, vocabulary) {
    Object.assign(this, { k, L, eos, penalty: Math.fround(penalty), vocabulary, finished: [], done: L - 1 <= 0 });
    this.beams = Array.from({ length: k }, (_, j) => ({ tokens: [], score: j === 0 ? 0 : Math.fround(-1e9) }));
    if (this.done) this.finish();
  }

  /** Enter a hypothesis (its tokens, float32 score) into the finished list, which holds k. */
  add(tokens, sum, length) {
    const score = Math.fround(sum / Math.fround(length ** this.penalty));
    const list = this.finished;
    if (list.length === this.k && !(score > list.at(-1).score)) return;
    let at = list.length;
    while (at > 0 && list[at - 1].score < score) at--;  // after every equal score: the earlier stays first
    list.splice(at, 0, { tokens, score });
    if (list.length > this.k) list.pop();
  }

  step(rows) {
    const { k } = this, top = [];  // the best 2k candidates, best first: score, then beam, then word id
    const better = (score, beam, word, than) => score > than.score
      || (score === than.score && (beam < than.beam || (beam === than.beam && word < than.word)));
    rows.forEach((row, beam) => {
      // a row: log-probabilities over the vocabulary, or decoder_batch.onnx's best {values, ids}
      const listed = row.ids !== undefined;
      const scores = listed ? row.values : this.vocabulary ? normalizedOver(row, this.vocabulary) : row;
      const base = this.beams[beam].score;
      for (let i = 0; i < scores.length; i++) {
        const score = Math.fround(base + scores[i]);
        const word = listed ? Number(row.ids[i]) : this.vocabulary ? this.vocabulary[i] : i;
        if (top.length === 2 * k && !better(score, beam, word, top.at(-1))) continue;
        let at = top.length;
        while (at > 0 && better(score, beam, word, top[at - 1])) at--;
        top.splice(at, 0, { score, beam, word });
        if (top.length > 2 * k) top.pop();
      }
    });
    const next = [], parents = [];
    for (const [rank, c] of top.entries()) {
      const tokens = this.beams[c.beam].tokens;
      if (c.word === this.eos) {
        // t counts the start token and the tokens before the EOS
        if (rank < k) this.add(tokens, c.score, tokens.length + 1);
      } else {
        next.push({ tokens: [...tokens, c.word], score: c.score });
        parents.push(c.beam);
        if (next.length === k) break;
      }
    }
    this.beams = next;
    if (this.finished.length === k) this.done = true;
    else if (next[0].tokens.length >= this.L - 1) this.finish();
    return parents;
  }

  finish() {  // L - 1 tokens generated: the live beams enter, scored over L
    for (const b of this.beams) this.add(b.tokens, b.score, this.L);
    this.done = true;
  }

  result() { return this.finished[0].tokens; }
}

/** log-softmax over `words` alone (float32), from log-probabilities over the whole vocabulary. */
export function normalizedOver(logProbs, words) {
  // Indexed loops: V8 runs them several times faster than for-of or Float32Array.from(words, f),
  // which took most of a beam step's time over a 5,568-word output vocabulary.
  const n = words.length, out = new Float32Array(n);
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (logProbs[words[i]] > max) max = logProbs[words[i]];
  let sum = 0;
  for (let i = 0; i < n; i++) sum = Math.fround(sum + Math.fround(Math.exp(Math.fround(logProbs[words[i]] - max))));
  const shift = Math.fround(max + Math.fround(Math.log(sum)));
  for (let i = 0; i < n; i++) out[i] = logProbs[words[i]] - shift;  // stored as float32: Math.fround's rounding
  return out;
}

// ## The shortlist, from shortlist.npz's arrays ({name: {data}}, as npz.mjs reads them)
export function shortlistRules(npz, gen) {
  const vocabSize = Number(npz.vocab_size.data[0]), always = [...new Set(npz.always.data)].sort((a, b) => a - b);
  const offsets = npz.offsets.data, words = npz.words.data;
  const specials = [gen.pad_id, gen.bos_id, gen.eos_id];
  let p = 0;
  for (let s = 0; s < vocabSize; s++) p = Math.max(p, offsets[s + 1] - offsets[s]);
  const W = Math.min(vocabSize, Math.ceil((always.length + 3 + 12 * p) / 64) * 64);
  const fixed = [...specials, ...always.filter((w) => !specials.includes(w))];
  const fixedSet = new Set(fixed);
  // The output vocabulary: every id in always or words, then the lowest other ids up to a multiple
  // of 64, in id order; none (the whole vocabulary) where that would be every word, or where the
  // lists lack a special id (the spec's wording settled against the Python runtime: README).
  const known = new Set([...always, ...words]);
  const target = Math.ceil(known.size / 64) * 64;
  let outputVocabulary = null;
  if (target < vocabSize && specials.every((id) => known.has(id))) {
    for (let id = 0; known.size < target; id++) known.add(id);
    outputVocabulary = Int32Array.from([...known].sort((a, b) => a - b));
  }
  return {
    outputVocabulary,
    /** A sentence's words: the specials, the non-special `always`, then its source words' words, W at most. */
    sentenceWords(src) {
      const more = new Set();
      for (const s of src) for (let i = offsets[s]; i < offsets[s + 1]; i++) if (!fixedSet.has(words[i])) more.add(words[i]);
      return [...fixed, ...[...more].sort((a, b) => a - b)].slice(0, W);
    },
  };
}
