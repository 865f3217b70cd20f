#!/usr/bin/env node
// doppler's own linear-attention core (doppler-gpu 0.5.1, src/gpu/kernels/linear-attention-core.js:
// its WGSL `linear_attention_conv` + `linear_attention_recurrent`, unchanged) on the CPU through a
// WebGPU provider, fed gdncheck's golden stage inputs, written as stage-isolated outputs
// (fixtures/FORMAT.md §7, §8):
//
//   node run.js --fixtures ../../../fixtures/default --out out [--case ID_OR_PREFIX ...] [--provider auto|doe|dawn]
//   gdncheck verify --fixtures fixtures/default --outputs out --profile f32 --stage-isolated
//
// The kernel fuses conv1d -> qk_norm -> gates -> delta_rule -> gated_norm. Its golden inputs per
// call k: calls.k.qkv (pre-conv), conv_state_in, z, a, b, recurrent_state_in, and the weights
// conv1d, dt_bias, A_log (as doppler stores it: aNegExp = -exp(A_log), f64 in JS, then f32), norm.
// It exposes: qkv_conv (its conv_out buffer, captured from its bind group), core_gated (its output),
// conv_state and recurrent_state (its state buffers after the call). It cannot expose q, k, v, g,
// beta or core: they live in registers and the output buffer is overwritten by the gated norm.
//
// Exit status: 0 every case ran, 2 some case could not be read, 3 no WebGPU adapter.

import { lstatSync, mkdirSync, readFileSync, realpathSync } from 'node:fs';
import { dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseSafetensors, sha256 } from '../../../examples/ports/node/safetensors.js';
import { callTensors, rowF32, writeCaseOutputs } from './outputs.js';
import { installProvider, probeDoe } from './provider.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const SERVING = new Set(['forward_packed', 'prefix_snapshots', 'verify_spec', 'commit', 'free']);
const NEEDED = ['qkv', 'z', 'a', 'b', 'conv_state_in', 'recurrent_state_in'];

function parseArgs(argv) {
  const args = { fixtures: 'fixtures/default', out: null, cases: [], provider: process.env.GDN_DOPPLER_PROVIDER || 'auto' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--fixtures') args.fixtures = argv[++i];
    else if (a === '--out') args.out = argv[++i];
    else if (a === '--case') args.cases.push(argv[++i]);
    else if (a === '--provider') args.provider = argv[++i];
    else if (a === '--help' || a === '-h') args.help = true;
    else throw new Error(`unknown argument ${a} (expected --fixtures DIR --out DIR [--case ID] [--provider auto|doe|dawn])`);
  }
  return args;
}

function caseFile(dir, name) {
  if (isAbsolute(name) || name.split(/[\\/]/).includes('..')) throw new Error(`file name ${name} leaves the fixture folder`);
  const path = join(dir, name);
  if (lstatSync(path).isSymbolicLink()) {
    const rel = relative(realpathSync(dir), realpathSync(path));
    if (rel.startsWith('..') || isAbsolute(rel)) throw new Error(`file ${name} links outside the fixture folder`);
  }
  return path;
}

function readCase(dir, entry) {
  const bytes = readFileSync(caseFile(dir, entry.file));
  if (bytes.length !== entry.bytes) throw new Error(`${entry.file}: ${bytes.length} bytes, the manifest says ${entry.bytes}`);
  const digest = sha256(bytes);
  if (digest !== entry.sha256) throw new Error(`${entry.file}: sha256 ${digest.slice(0, 16)}..., the manifest says ${entry.sha256.slice(0, 16)}...`);
  return parseSafetensors(bytes, entry.file);
}

// Provider choice: doe-gpu (the brief's) when its adapter probe survives, else Dawn + the shim.
export async function setupWebGPU(choice) {
  let detail = '';
  if (choice === 'auto' || choice === 'doe') {
    const p = probeDoe();
    if (p.ok) return { ...(await installProvider('doe')), note: p.detail };
    detail = p.detail;
    if (choice === 'doe') return { name: null, note: detail };
  }
  return { ...(await installProvider('dawn')), note: detail ? `fell back to Dawn: ${detail}` : '' };
}

// doppler's modules, imported after navigator.gpu exists.
async function loadDoppler() {
  const base = join(HERE, 'node_modules', 'doppler-gpu', 'src');
  const url = (p) => new URL(`file://${join(base, p)}`).href;
  const device = await import(url('gpu/device.js'));
  const pool = await import(url('memory/buffer-pool.js'));
  const tensor = await import(url('gpu/tensor.js'));
  const core = await import(url('gpu/kernels/linear-attention-core.js'));
  return { device, pool, tensor, core };
}

// The layer state doppler's linear-attention.js (createLayerRuntimeState) builds, from the case's
// config and weights, with its f32 weight copies on the GPU.
function layerStateFor(D, entry, st) {
  const c = entry.config;
  const Hk = c.linear_num_key_heads; const Hv = c.linear_num_value_heads;
  const dk = c.linear_key_head_dim; const dv = c.linear_value_head_dim;
  const keyDim = Hk * dk; const valueDim = Hv * dv; const convDim = 2 * keyDim + valueDim;
  const w = (n) => st.tensors[`weights.linear_attn.${n}`];
  const K = w('conv1d.weight').shape[2];
  const aLog = w('A_log').data;
  const aNegExp = new Float32Array(aLog.length);
  for (let i = 0; i < aLog.length; i++) aNegExp[i] = -Math.exp(aLog[i]);
  const norm = Float32Array.from(w('norm.weight').data);
  const normMode = c.linear_norm_mode ?? (norm.length === dv ? 'shared' : 'per_head');
  const up = (values, label) => { const buf = D.pool.acquireBuffer(values.byteLength, undefined, label); D.pool.uploadData(buf, values); return buf; };
  const convState = new Float32Array(convDim * K);
  const recurrentState = new Float32Array(Hv * dk * dv);
  const s = {
    layerIdx: 0, seqLen: 0, convKernelSize: K, convDim, keyDim, valueDim, numKHeads: Hk, numVHeads: Hv,
    headKDim: dk, headVDim: dv, qSize: keyDim, kSize: keyDim, vSize: valueDim, qRep: Hv / Hk,
    normMode: normMode === 'per-head' || normMode === 'perhead' ? 'per_head' : normMode,
    rmsNormEps: Number(c.rms_norm_eps) || 1e-6,
    convWeight: Float32Array.from(w('conv1d.weight').data), dtBias: Float32Array.from(w('dt_bias').data), aNegExp, normWeight: norm,
    convState, recurrentState,
  };
  s.convWeightGPU = up(s.convWeight, 'L0.linear_conv_weight');
  s.dtBiasGPU = up(s.dtBias, 'L0.linear_dt_bias');
  s.aNegExpGPU = up(s.aNegExp, 'L0.linear_a_neg_exp');
  s.normWeightGPU = up(s.normWeight, 'L0.linear_norm_weight');
  s.convStateGPU = up(convState, 'L0.linear_conv_state');
  s.recurrentStateGPU = up(recurrentState, 'L0.linear_recurrent_state');
  return s;
}

// Tests only (GDN_DOPPLER_GLUE_MUTANT=state_transposed, never the judged default): a deliberate glue error,
// each head's entering state fed transposed, which the matrix must report unexplained, not explained by a
// known finding (tests/engines/test_engines.py).
function enteringState(data, s) {
  if (process.env.GDN_DOPPLER_GLUE_MUTANT !== 'state_transposed') return data;
  const { numVHeads: Hv, headKDim: dk, headVDim: dv } = s;
  const out = new Float32Array(data.length);
  for (let h = 0; h < Hv; h++) {
    for (let i = 0; i < dk; i++) for (let j = 0; j < dv; j++) out[h * dk * dv + j * dk + i] = data[h * dk * dv + i * dv + j];
  }
  return out;
}

// One call of doppler's core on one sequence row, from the golden inputs.
async function runRow(D, gpu, s, st, k, b, T, capture) {
  const g = (n) => st.tensors[`calls.${k}.${n}`];
  D.pool.uploadData(s.convStateGPU, rowF32(g('conv_state_in'), b));
  D.pool.uploadData(s.recurrentStateGPU, enteringState(rowF32(g('recurrent_state_in'), b), s));
  const tensors = {};
  const made = [];
  for (const [name, shape] of [['qkv', [T, s.convDim]], ['z', [T, s.valueDim]], ['a', [T, s.numVHeads]], ['b', [T, s.numVHeads]]]) {
    const data = rowF32(g(name), b);
    const buf = D.pool.acquireBuffer(Math.max(16, data.byteLength), undefined, `gdncheck_${name}`);
    D.pool.uploadData(buf, data);
    made.push(buf);
    tensors[name] = D.tensor.createTensor(buf, 'f32', shape, `gdncheck_${name}`);
  }
  capture.convOut = null;
  const out = await D.core.runLinearAttentionCoreGPU(tensors.qkv, tensors.z, tensors.a, tensors.b, s, { numTokens: T, layerIdx: 0, qkL2NormEps: 1e-6, outputDtype: 'f32' });
  await gpu.queue.onSubmittedWorkDone(); // doe workaround 3 (harmless elsewhere): wait after the submit
  const f32 = async (buf, n) => new Float32Array((await D.pool.readBuffer(buf, n * 4)).slice(0));
  const row = {
    coreGated: await f32(out.buffer, T * s.valueDim),
    convState: await f32(s.convStateGPU, s.convDim * s.convKernelSize),
    recurrentState: await f32(s.recurrentStateGPU, s.numVHeads * s.headKDim * s.headVDim),
    qkvConv: capture.convOut ? await f32(capture.convOut, T * s.convDim) : null,
  };
  D.pool.releaseBuffer(out.buffer);
  for (const buf of made) D.pool.releaseBuffer(buf);
  return row;
}

async function runCase(D, gpu, entry, st, capture) {
  const s = layerStateFor(D, entry, st);
  const tensors = {};
  const skipped = [];
  for (const step of entry.program) {
    if (step.op !== 'forward' && step.op !== 'decode') continue;
    const k = step.call;
    const missing = NEEDED.filter((n) => !st.tensors[`calls.${k}.${n}`]);
    if (missing.length) { skipped.push(`call ${k} (no ${missing.join(', ')})`); continue; }
    const [B, T] = st.tensors[`calls.${k}.qkv`].shape;
    const rows = [];
    for (let b = 0; b < B; b++) rows.push(await runRow(D, gpu, s, st, k, b, T, capture));
    Object.assign(tensors, callTensors(k, { T, convDim: s.convDim, K: s.convKernelSize, Hv: s.numVHeads, dk: s.headKDim, dv: s.headVDim }, rows));
  }
  for (const buf of [s.convWeightGPU, s.dtBiasGPU, s.aNegExpGPU, s.normWeightGPU, s.convStateGPU, s.recurrentStateGPU]) D.pool.releaseBuffer(buf);
  return { tensors, skipped };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.help || !args.out) {
    console.log('usage: node run.js --fixtures DIR --out DIR [--case ID_OR_PREFIX ...] [--provider auto|doe|dawn]');
    return args.help ? 0 : 2;
  }
  const dir = resolve(args.fixtures);
  const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  // format 1 (before minor versions) or 1.N (FORMAT.md §10): this stage-isolated runner reads no program step
  const v = manifest.format_version;
  if (manifest.format !== 'gdncheck-fixtures' || !(v === 1 || (typeof v === 'string' && /^1\.[0-9]+$/.test(v)))) throw new Error(`${dir}/manifest.json: not gdncheck-fixtures 1 or 1.N`);
  const provider = await setupWebGPU(args.provider);
  if (!provider.name) { console.log(`no WebGPU adapter: ${provider.note}`); return 3; }
  if (provider.note) console.log(provider.note);
  const D = await loadDoppler();
  const gpu = await D.device.initDevice(); // doppler's own device initialisation
  if (!gpu) { console.log('no WebGPU adapter: doppler initDevice() returned none'); return 3; }
  // Every error the device reports (a shader that did not compile, a validation error) fails the case
  // it happened in: no outputs file is written from a pipeline that did not run.
  const gpuErrors = [];
  const onError = (ev) => gpuErrors.push(String(ev?.error?.message ?? ev?.message ?? ev).split('\n')[0]);
  if (typeof gpu.addEventListener === 'function') gpu.addEventListener('uncapturederror', onError);
  else gpu.onuncapturederror = onError;
  // Capture the conv_out buffer (qkv_conv) from the kernel's own conv bind group.
  const capture = { convOut: null };
  const createBindGroup = gpu.createBindGroup.bind(gpu);
  gpu.createBindGroup = (desc) => {
    if (desc?.label === 'linear_attention_conv_bind_group') capture.convOut = desc.entries.find((e) => e.binding === 4)?.resource?.buffer ?? null;
    return createBindGroup(desc);
  };
  const pkg = (n) => JSON.parse(readFileSync(join(HERE, 'node_modules', n, 'package.json'), 'utf8')).version;
  const providerDesc = provider.name === 'doe' ? `doe-gpu ${pkg('doe-gpu')} (workarounds: override->const, unlabeled passes, queue wait, one pass per submit)`
    : `webgpu (Dawn) ${pkg('webgpu')} + vkshim on lavapipe`;
  mkdirSync(args.out, { recursive: true });
  const command = `node conformance/engines/doppler/run.js --fixtures ${args.fixtures} --out ${args.out}`;
  let unusable = 0;
  for (const entry of manifest.cases) {
    if (args.cases.length && !args.cases.some((c) => entry.id.startsWith(c))) continue;
    if (entry.kind === 'error' || entry.program.some((s) => SERVING.has(s.op))) {
      console.log(`skipped  ${entry.id}: ${entry.kind === 'error' ? 'an expected-error case' : 'a serving case'} (not judged stage-isolated)`);
      continue;
    }
    const t0 = performance.now();
    let st;
    try { st = readCase(dir, entry); } catch (err) { unusable++; console.log(`skipped  ${entry.id}: ${err.message}`); continue; }
    const errorsBefore = gpuErrors.length;
    const { tensors, skipped } = await runCase(D, gpu, entry, st, capture);
    if (gpuErrors.length > errorsBefore) {
      unusable++;
      console.log(`failed   ${entry.id}: the WebGPU device reported ${gpuErrors.length - errorsBefore} error(s), the first: `
        + `${gpuErrors[errorsBefore].slice(0, 300)}; no outputs written`);
      continue;
    }
    writeCaseOutputs(args.out, entry, tensors, {
      implementation: process.env.GDN_DOPPLER_PATCH === 'barrier'
        ? `doppler-gpu ${pkg('doppler-gpu')} linear-attention-core + DIAGNOSTIC barrier patch (not doppler's code)`
        : `doppler-gpu ${pkg('doppler-gpu')} linear-attention-core (WGSL conv + recurrent, unchanged)`,
      device: `cpu, ${providerDesc}, Node.js ${process.version}`, command,
    });
    console.log(`ran      ${entry.id} (${(performance.now() - t0).toFixed(0)} ms)${skipped.length ? `; skipped ${skipped.join('; ')}` : ''}`);
  }
  return unusable ? 2 : 0;
}

process.exit(await main());
