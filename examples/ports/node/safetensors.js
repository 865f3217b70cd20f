// Reading and writing safetensors files by hand (fixtures/FORMAT.md §3, §7): an 8-byte little-endian
// header length N, N bytes of JSON, then the data. Row-major, little-endian.

import { createHash } from 'node:crypto';
import { readFileSync, realpathSync, renameSync, writeFileSync } from 'node:fs';
import { isAbsolute, relative, resolve } from 'node:path';

const BYTES = { F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4 };
export const FLOAT_DTYPES = new Set(['F64', 'F32', 'F16', 'BF16']);

export function sha256(buffer) {
  return createHash('sha256').update(buffer).digest('hex');
}

// IEEE binary16 -> number.
function halfToNumber(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

// One tensor's bytes -> a typed array: Float32Array for F32/BF16/F16, Float64Array for F64,
// Int32Array for I32, BigInt64Array for I64.
function decode(dtype, bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = bytes.byteLength / BYTES[dtype];
  switch (dtype) {
    case 'F64': { const a = new Float64Array(n); for (let i = 0; i < n; i++) a[i] = view.getFloat64(8 * i, true); return a; }
    case 'F32': { const a = new Float32Array(n); for (let i = 0; i < n; i++) a[i] = view.getFloat32(4 * i, true); return a; }
    case 'BF16': {
      // the upper 16 bits of a binary32: f32 = uint32(u16) << 16
      const bits = new Uint32Array(n);
      for (let i = 0; i < n; i++) bits[i] = view.getUint16(2 * i, true) << 16;
      return new Float32Array(bits.buffer);
    }
    case 'F16': { const a = new Float32Array(n); for (let i = 0; i < n; i++) a[i] = halfToNumber(view.getUint16(2 * i, true)); return a; }
    case 'I32': { const a = new Int32Array(n); for (let i = 0; i < n; i++) a[i] = view.getInt32(4 * i, true); return a; }
    case 'I64': { const a = new BigInt64Array(n); for (let i = 0; i < n; i++) a[i] = view.getBigInt64(8 * i, true); return a; }
    default: throw new Error(`unsupported safetensors dtype ${dtype}`);
  }
}

// A parsed file: { metadata, tensors: { name: { dtype, shape, data } } }.
export function parseSafetensors(buffer, label = 'file') {
  if (buffer.length < 8) throw new Error(`${label}: shorter than the 8-byte header length`);
  const n = Number(buffer.readBigUInt64LE(0));
  if (8 + n > buffer.length) throw new Error(`${label}: header of ${n} bytes runs past the end of the file`);
  const header = JSON.parse(buffer.subarray(8, 8 + n).toString('utf8'));
  const data = buffer.subarray(8 + n);
  const tensors = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [begin, end] = info.data_offsets;
    const count = info.shape.reduce((a, b) => a * b, 1);
    if (end - begin !== count * BYTES[info.dtype] || end > data.length) {
      throw new Error(`${label}: tensor ${name} (${info.dtype} ${JSON.stringify(info.shape)}) has a bad byte range`);
    }
    tensors[name] = { dtype: info.dtype, shape: info.shape, data: decode(info.dtype, data.subarray(begin, end)) };
  }
  return { metadata: header.__metadata__ ?? {}, tensors };
}

export function readSafetensors(path) {
  return parseSafetensors(readFileSync(path), path);
}

// Write { name: { dtype: 'F32' | 'I64', shape, data } } with string metadata, names sorted, to a
// temporary file renamed into place (no partial file is ever left).
export function writeSafetensors(path, tensors, metadata) {
  const names = Object.keys(tensors).sort();
  const header = { __metadata__: metadata };
  const chunks = [];
  let offset = 0;
  for (const name of names) {
    const { dtype, shape, data } = tensors[name];
    const size = BYTES[dtype];
    const buf = Buffer.alloc(data.length * size);
    for (let i = 0; i < data.length; i++) {
      if (dtype === 'F32') buf.writeFloatLE(data[i], 4 * i);
      else if (dtype === 'F64') buf.writeDoubleLE(data[i], 8 * i);
      else if (dtype === 'I64') buf.writeBigInt64LE(BigInt(data[i]), 8 * i);
      else if (dtype === 'I32') buf.writeInt32LE(data[i], 4 * i);
      else throw new Error(`cannot write dtype ${dtype}`);
    }
    header[name] = { dtype, shape, data_offsets: [offset, offset + buf.length] };
    offset += buf.length;
    chunks.push(buf);
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (json.length % 8)) % 8;
  json = Buffer.concat([json, Buffer.alloc(pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, Buffer.concat([len, json, ...chunks]));
  renameSync(tmp, path);
}

// The path of a file a runner writes or reads back in its outputs folder (--out): a case id
// (`ID.safetensors`) or a snapshot name from the manifest must be a plain relative name that stays
// inside --out (no `..`, no absolute path, no backslash or control character, no link out), so a
// hostile manifest never writes elsewhere. Every runner built on these files writes through it.
export const CASE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/; // fixtures/manifest.schema.json
export function outFile(outDir, name, what) {
  const parts = String(name).split('/');
  if (typeof name !== 'string' || !name || isAbsolute(name) || /[\\\x00-\x1f\x7f]/.test(name)
      || parts.some((p) => p === '' || p === '.' || p === '..')) {
    throw new Error(`${what} name ${JSON.stringify(name)} leaves --out (expected a relative name inside it)`);
  }
  const root = realpathSync(outDir);
  const path = resolve(root, name);
  const rel = relative(root, path);
  if (!rel || rel.startsWith('..') || isAbsolute(rel)) throw new Error(`${what} name ${JSON.stringify(name)} leaves --out`);
  let real = null;
  try { real = realpathSync(path); } catch { /* not written yet */ }
  if (real !== null) {
    const r = relative(root, real);
    if (r.startsWith('..') || isAbsolute(r)) throw new Error(`${what} ${name} links outside --out`);
  }
  return path;
}
