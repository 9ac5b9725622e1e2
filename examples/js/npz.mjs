// A small reader for NumPy's .npz files (a zip of .npy files, as numpy.savez writes them): the
// zip's central directory (zip64 sizes and offsets included), stored or deflated members, and
// little-endian integer, float and bool arrays in C order. Pickled (object) arrays are refused.

import { readFileSync } from "node:fs";
import { inflateRawSync } from "node:zlib";

const DTYPES = {
  "<i8": (b) => Array.from(new BigInt64Array(b), Number), "<i4": (b) => new Int32Array(b),
  "<i2": (b) => new Int16Array(b), "|i1": (b) => new Int8Array(b), "<u8": (b) => Array.from(new BigUint64Array(b), Number),
  "<u4": (b) => new Uint32Array(b), "<u2": (b) => new Uint16Array(b), "|u1": (b) => new Uint8Array(b),
  "|b1": (b) => new Uint8Array(b), "<f4": (b) => new Float32Array(b), "<f8": (b) => new Float64Array(b),
};

/** The arrays of an .npz file: {name (without .npy): {dtype, shape, data}}; a 0-d array's data has one value. */
export function readNpz(path) {
  const zip = readFileSync(path);
  const arrays = {};
  for (const entry of centralDirectory(zip)) {
    const nameLength = zip.readUInt16LE(entry.localOffset + 26), extraLength = zip.readUInt16LE(entry.localOffset + 28);
    if (zip.readUInt32LE(entry.localOffset) !== 0x04034b50) throw new Error(`${path}: bad zip member ${entry.name}`);
    const start = entry.localOffset + 30 + nameLength + extraLength;
    const raw = zip.subarray(start, start + entry.compressedSize);
    const body = entry.method === 0 ? raw : entry.method === 8 ? inflateRawSync(raw) : null;
    if (body === null) throw new Error(`${path}: ${entry.name} uses zip compression method ${entry.method}`);
    arrays[entry.name.replace(/\.npy$/, "")] = readNpy(body, `${path}:${entry.name}`);
  }
  return arrays;
}

function centralDirectory(zip) {
  let end = zip.length - 22;  // the end-of-central-directory record, after at most a 64 KiB comment
  while (end >= Math.max(0, zip.length - 22 - 0xffff) && zip.readUInt32LE(end) !== 0x06054b50) end--;
  if (end < 0 || zip.readUInt32LE(end) !== 0x06054b50) throw new Error("not a zip file");
  let count = zip.readUInt16LE(end + 10), offset = zip.readUInt32LE(end + 16);
  if (count === 0xffff || offset === 0xffffffff) {  // zip64: the locator just before points at the real record
    const record = Number(zip.readBigUInt64LE(end - 20 + 8));
    count = Number(zip.readBigUInt64LE(record + 32));
    offset = Number(zip.readBigUInt64LE(record + 48));
  }
  const entries = [];
  for (let i = 0; i < count; i++) {
    if (zip.readUInt32LE(offset) !== 0x02014b50) throw new Error("bad zip central directory");
    const nameLength = zip.readUInt16LE(offset + 28), extraLength = zip.readUInt16LE(offset + 30);
    const commentLength = zip.readUInt16LE(offset + 32);
    const entry = {
      method: zip.readUInt16LE(offset + 10), compressedSize: zip.readUInt32LE(offset + 20),
      size: zip.readUInt32LE(offset + 24), localOffset: zip.readUInt32LE(offset + 42),
      name: zip.toString("utf8", offset + 46, offset + 46 + nameLength),
    };
    // zip64 extra field (id 1): the 64-bit values of the fields set to 0xffffffff, in this order.
    for (let at = offset + 46 + nameLength; at < offset + 46 + nameLength + extraLength;) {
      const id = zip.readUInt16LE(at), size = zip.readUInt16LE(at + 2);
      if (id === 1) {
        let field = at + 4;
        for (const key of ["size", "compressedSize", "localOffset"]) {
          if (entry[key] === 0xffffffff) { entry[key] = Number(zip.readBigUInt64LE(field)); field += 8; }
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
  if (bytes.readUInt8(0) !== 0x93 || bytes.toString("latin1", 1, 6) !== "NUMPY") throw new Error(`${where}: not .npy`);
  const major = bytes.readUInt8(6);
  const headerLength = major === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const dataStart = (major === 1 ? 10 : 12) + headerLength;
  const header = bytes.toString("latin1", major === 1 ? 10 : 12, dataStart);
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
