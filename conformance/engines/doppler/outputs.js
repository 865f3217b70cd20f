// The glue between doppler's buffers and gdncheck's files, with no WebGPU in it (tested alone:
// tests/engines/doppler/test_doppler_webgpu.py). doppler's kernel runs one sequence at a time; its layouts:
//   qkv [T, conv_dim], z [T, Hv*dv], a, b [T, Hv] (the kernel's inputs, f32 here),
//   conv_state [conv_dim, K] (oldest first, K slots), recurrent_state [Hv, dk, dv] (v fastest),
//   conv_out [T, conv_dim] (post-SiLU), output [T, Hv*dv] (core_gated).
// gdncheck's (fixtures/FORMAT.md §5): qkv_conv [B, T, conv_dim], core_gated [B, T, Hv, dv],
//   conv_state [B, conv_dim, K], recurrent_state [B, Hv, dk, dv].

import { CASE_ID, outFile, writeSafetensors } from '../../../examples/ports/node/safetensors.js';

// Row b of a golden tensor [B, ...] as float32, the activation dtype doppler's f32 path uses.
export function rowF32(tensor, b) {
  const [B] = tensor.shape;
  const n = tensor.data.length / B;
  return Float32Array.from(tensor.data.subarray(b * n, (b + 1) * n));
}

// Per-sequence results [{qkvConv, coreGated, convState, recurrentState}] (doppler's layouts, one per
// batch row) -> gdncheck tensors of call k. doppler's per-sequence layouts are gdncheck's rows
// exactly (no transpose: conv [conv_dim, K] oldest first, state [Hv, dk, dv]), so stacking the rows
// is the whole conversion; the shapes say which is which.
export function callTensors(k, dims, rows) {
  const { T, convDim, K, Hv, dk, dv } = dims;
  const B = rows.length;
  const stackRows = (name, per) => {
    const out = new Float32Array(B * per);
    rows.forEach((r, b) => {
      if (r[name].length !== per) throw new Error(`${name}: row ${b} has ${r[name].length} values, expected ${per}`);
      out.set(r[name], b * per);
    });
    return out;
  };
  const t = {};
  if (rows.every((r) => r.qkvConv)) t[`calls.${k}.qkv_conv`] = { dtype: 'F32', shape: [B, T, convDim], data: stackRows('qkvConv', T * convDim) };
  t[`calls.${k}.core_gated`] = { dtype: 'F32', shape: [B, T, Hv, dv], data: stackRows('coreGated', T * Hv * dv) };
  t[`calls.${k}.conv_state`] = { dtype: 'F32', shape: [B, convDim, K], data: stackRows('convState', convDim * K) };
  t[`calls.${k}.recurrent_state`] = { dtype: 'F32', shape: [B, Hv, dk, dv], data: stackRows('recurrentState', Hv * dk * dv) };
  return t;
}

export function outputsMetadata(entry, extra = {}) {
  return {
    format: 'gdncheck-outputs', format_version: '1', case: entry.id, fixture_sha256: entry.sha256,
    mode: 'stage_isolated', profile: 'f32', ...extra,
  };
}

export function writeCaseOutputs(outDir, entry, tensors, extra = {}) {
  if (typeof entry.id !== 'string' || !CASE_ID.test(entry.id)) {
    throw new Error(`case id ${JSON.stringify(entry.id)} is not a case id (${CASE_ID}): its outputs file would leave --out`);
  }
  const path = outFile(outDir, `${entry.id}.safetensors`, 'outputs file'); // never outside --out
  writeSafetensors(path, tensors, outputsMetadata(entry, extra));
  return path;
}
