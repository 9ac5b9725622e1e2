// A small reader for NumPy's .npz files (a zip of .npy files, as numpy.savez writes them): the
// zip's central directory (zip64 sizes and offsets included), stored or deflated members, and
// little-endian integer, float and bool arrays in C order. Pickled (object) arrays are refused.
// It runs in Node.js and in a browser alike: the caller gives the bytes and a raw-deflate inflater
// (Node's zlib.inflateRawSync, a browser's DecompressionStream("deflate-raw")).

const DTYPES = {
  "<i8": (b) => Array.from(new BigInt64Array(b), Number), "<i4": (b) => new Int32Array(b),
  "<i2": (b) => new Int16Array(b), "|i1": (b) => new Int8Array(b), "<u8": (b) => Array.from(new BigUint64Array(b), Number),
  "<u4": (b) => new Uint32Array(b), "<u2": (b) => new Uint16Array(b), "|u1": (b) => new Uint8Array(b),
  "|b1": (b) => new Uint8Array(b), "<f4": (b) => new Float32Array(b), "<f8": (b) => new Float64Array(b),
};

/**
 * The arrays of an .npz file: {name (without .npy): {dtype, shape, data}}; a 0-d array's data has one value.
 * @param zip {Uint8Array} the file's bytes
 * @param inflateRaw {(bytes: Uint8Array) => Uint8Array | Promise<Uint8Array>}
 */
export async function readNpz(zip, inflateRaw, where = "npz") {
  const view = new DataView(zip.buffer, zip.byteOffset, zip.byteLength);
  const arrays = {};
  for (const entry of centralDirectory(view)) {
    const nameLength = view.getUint16(entry.localOffset + 26, true), extraLength = view.getUint16(entry.localOffset + 28, true);
    if (view.getUint32(entry.localOffset, true) !== 0x04034b50) throw new Error(`${where}: bad zip member ${entry.name}`);
    const start = entry.localOffset + 30 + nameLength + extraLength;
    const raw = zip.subarray(start, start + entry.compressedSize);
    const body = entry.method === 0 ? raw : entry.method === 8 ? await inflateRaw(raw) : null;
    if (body === null) throw new Error(`${where}: ${entry.name} uses zip compression method ${entry.method}`);
    arrays[entry.name.replace(/\.npy$/, "")] = readNpy(new Uint8Array(body.buffer, body.byteOffset, body.byteLength), `${where}:${entry.name}`);
  }
  return arrays;
}

const text = (bytes, encoding) => new TextDecoder(encoding).decode(bytes);

function centralDirectory(zip) {
  const u16 = (at) => zip.getUint16(at, true), u32 = (at) => zip.getUint32(at, true);
  const u64 = (at) => Number(zip.getBigUint64(at, true));
  let end = zip.byteLength - 22;  // the end-of-central-directory record, after at most a 64 KiB comment
  while (end >= Math.max(0, zip.byteLength - 22 - 0xffff) && u32(end) !== 0x06054b50) end--;
  if (end < 0 || u32(end) !== 0x06054b50) throw new Error("not a zip file");
  let count = u16(end + 10), offset = u32(end + 16);
  if (count === 0xffff || offset === 0xffffffff) {  // zip64: the locator just before points at the real record
    const record = u64(end - 20 + 8);
    count = u64(record + 32);
    offset = u64(record + 48);
  }
  const bytes = new Uint8Array(zip.buffer, zip.byteOffset, zip.byteLength);
  const entries = [];
  for (let i = 0; i < count; i++) {
    if (u32(offset) !== 0x02014b50) throw new Error("bad zip central directory");
    const nameLength = u16(offset + 28), extraLength = u16(offset + 30), commentLength = u16(offset + 32);
    const entry = {
      method: u16(offset + 10), compressedSize: u32(offset + 20), size: u32(offset + 24), localOffset: u32(offset + 42),
      name: text(bytes.subarray(offset + 46, offset + 46 + nameLength), "utf-8"),
    };
    // zip64 extra field (id 1): the 64-bit values of the fields set to 0xffffffff, in this order.
    for (let at = offset + 46 + nameLength; at < offset + 46 + nameLength + extraLength;) {
      const id = u16(at), size = u16(at + 2);
      if (id === 1) {
        let field = at + 4;
        for (const key of ["size", "compressedSize", "localOffset"]) {
          if (entry[key] === 0xffffffff) { entry[key] = u64(field); field += 8; }
        }
      }
      at += 4 + size;
    }
    entries.push(entry);
    offset += 46 + nameLength + extraLength + commentLength;
  }
  return entries;
}

function readNpy(bytes, where) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes[0] !== 0x93 || text(bytes.subarray(1, 6), "latin1") !== "NUMPY") throw new Error(`${where}: not .npy`);
  const major = bytes[6];
  const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const dataStart = (major === 1 ? 10 : 12) + headerLength;
  const header = text(bytes.subarray(major === 1 ? 10 : 12, dataStart), "latin1");
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*True/.test(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (!descr || shapeText === undefined || !(descr in DTYPES) || fortran) {
    throw new Error(`${where}: unsupported .npy header ${header.trim()}`);
  }
  const shape = shapeText.split(",").map((s) => s.trim()).filter(Boolean).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const itemSize = Number(descr.slice(2));
  const copy = new ArrayBuffer(count * itemSize);  // aligned for the typed array
  new Uint8Array(copy).set(bytes.subarray(dataStart, dataStart + count * itemSize));
  return { dtype: descr, shape, data: DTYPES[descr](copy) };
}
