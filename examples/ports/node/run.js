#!/usr/bin/env node
// Runs every case of a gdncheck fixture folder through the float32 layer of layer.js and writes the
// outputs `gdncheck verify --profile f32` judges (fixtures/FORMAT.md §2, §4, §4.1, §7, §11).
//
//   node run.js --fixtures ../../../fixtures/default --out out [--case ID_OR_PREFIX ...]
//
// A case that requires a format feature this runner does not implement (features.js; GDN_NODE_FEATURES
// picks an older set) is written not applicable from the step that needs it (FORMAT.md §7).
//
// Exit status: 0 every case ran (its outputs written, an expected or unexpected error included),
// 2 some case could not be read (missing or damaged file, checksum mismatch, a path outside the folder).

import { lstatSync, mkdirSync, readFileSync, realpathSync } from 'node:fs';
import { isAbsolute, join, relative, resolve } from 'node:path';
import { GDNError, GDNLayer, PAD_SLOT_ID } from './layer.js';
import { featuresFromEnv, notApplicable, readableVersion } from './features.js';
import { CASE_ID, outFile, parseSafetensors, readSafetensors, sha256, writeSafetensors } from './safetensors.js';

const OUTPUTS_FORMAT_VERSION = '1';

function parseArgs(argv) {
  const args = { fixtures: 'fixtures/default', out: null, cases: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--fixtures') args.fixtures = argv[++i];
    else if (a === '--out') args.out = argv[++i];
    else if (a === '--case') args.cases.push(argv[++i]);
    else if (a === '--help' || a === '-h') args.help = true;
    else throw new Error(`unknown argument ${a} (expected --fixtures DIR --out DIR [--case ID])`);
  }
  return args;
}

// A case file's path, refusing names that leave the fixture folder (§2: `..`, absolute paths, links).
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

// x [B, T, D] -> token j of every sequence, [B, 1, D]
// A prefix_snapshots call's requests (docs/serving.md §3): a sequence of the call that has a slot, an
// offset in 1..its length, each (sequence, offset) once, a destination slot in [0, S).
function checkSnapshots(step, S) {
  const seen = new Set();
  (step.snap_seq || []).forEach((i, m) => {
    const off = step.snap_offset[m];
    const dest = step.snap_slot[m];
    const n = step.slots.length;
    if (!Number.isInteger(i) || i < 0 || i >= n) throw new GDNError('snapshot_request', `snapshot ${m}: sequence ${i} is not one of the call's ${n}`);
    if (step.slots[i] === PAD_SLOT_ID) throw new GDNError('snapshot_request', `snapshot ${m}: sequence ${i} is a padding sequence`);
    const len = step.cu_seqlens[i + 1] - step.cu_seqlens[i];
    if (!Number.isInteger(off) || off < 1 || off > len) throw new GDNError('snapshot_request', `snapshot ${m}: offset ${off}, expected 1..${len}`);
    if (seen.has(`${i}:${off}`)) throw new GDNError('snapshot_request', `snapshot ${m}: sequence ${i} offset ${off} twice`);
    seen.add(`${i}:${off}`);
    if (!Number.isInteger(dest) || dest < 0 || dest >= S) throw new GDNError('slot_index', `snapshot ${m}: destination slot ${dest} is not in [0, ${S})`);
  });
}

function tokenSlice(x, j) {
  const [B, T, D] = x.shape;
  const data = new Float32Array(B * D);
  for (let b = 0; b < B; b++) data.set(x.data.subarray((b * T + j) * D, (b * T + j + 1) * D), b * D);
  return { dtype: x.dtype, shape: [B, 1, D], data };
}

// T traces of one-token calls -> one trace stacked along the token axis
function stack(traces) {
  const out = {};
  for (const name of Object.keys(traces[0])) {
    const [B, , ...rest] = traces[0][name].shape;
    const n = rest.reduce((p, q) => p * q, 1);
    const T = traces.length;
    const data = new Float32Array(B * T * n);
    traces.forEach((tr, j) => {
      for (let b = 0; b < B; b++) data.set(tr[name].data.subarray(b * n, (b + 1) * n), (b * T + j) * n);
    });
    out[name] = { shape: [B, T, ...rest], data };
  }
  return out;
}

function stateTensors(layer, state) {
  const { convDim, K, Hv, dk, dv } = layer.c;
  return {
    conv_state: { dtype: 'F32', shape: [state.batch, convDim, K], data: state.conv.slice() },
    recurrent_state: { dtype: 'F32', shape: [state.batch, Hv, dk, dv], data: state.rec.slice() },
    seq_len: { dtype: 'I64', shape: [state.batch], data: state.seqLen.slice() },
  };
}

// After call k: the stage tensors the step expects, the two states, and seq_len.
function keep(outputs, step, trace, layer, state) {
  const k = step.call;
  for (const name of step.expected) {
    // expert indices as integers (I64), every other stage tensor float32
    if (trace[name]) outputs[`calls.${k}.${name}`] = { dtype: name === 'selected_experts' ? 'I64' : 'F32', ...trace[name] };
  }
  for (const [name, t] of Object.entries(stateTensors(layer, state))) outputs[`calls.${k}.${name}`] = t;
}

function runCase(st, entry, outDir, stopAt = Infinity) {
  const weights = {};
  for (const [name, t] of Object.entries(st.tensors)) if (name.startsWith('weights.')) weights[name.slice(8)] = t;
  const outputs = {};
  const slots = {};
  const verifies = {}; // verify_spec call -> each sequence's states after 1..k tokens
  let layer = null;
  let state = null;
  let i = 0;
  try {
    for (i = 0; i < entry.program.length && i < stopAt; i++) {
      const step = entry.program[i];
      switch (step.op) {
        case 'construct':
          layer = new GDNLayer(entry.config, weights, { strict: step.strict });
          state = layer.newState(entry.batch);
          break;
        case 'reset':
          state = layer.newState(entry.batch);
          break;
        case 'forward':
          keep(outputs, step, layer.forward(st.tensors[`calls.${step.call}.x`], state, step.seq_pos), layer, state);
          break;
        case 'decode': {
          const x = st.tensors[`calls.${step.call}.x`];
          const traces = [];
          for (let j = 0; j < step.T; j++) traces.push(layer.forward(tokenSlice(x, j), state, step.seq_pos.map((p) => p + j)));
          keep(outputs, step, stack(traces), layer, state);
          break;
        }
        case 'snapshot':
          slots[step.slot] = GDNLayer.cloneState(state);
          break;
        case 'restore':
          state = GDNLayer.cloneState(slots[step.slot]);
          break;
        case 'save':
          writeSafetensors(outFile(outDir, step.file, 'snapshot file'), stateTensors(layer, slots[step.slot]), { format: 'gdncheck-snapshot-port' });
          break;
        case 'load': {
          const snap = readSafetensors(outFile(outDir, step.file, 'snapshot file')).tensors;
          slots[step.slot] = {
            batch: entry.batch, conv: Float32Array.from(snap.conv_state.data), rec: Float32Array.from(snap.recurrent_state.data),
            seqLen: Array.from(snap.seq_len.data, Number),
          };
          break;
        }
        // the serving steps (FORMAT.md §4.1): the state is a pool of entry.batch slots
        case 'forward_packed':
        case 'prefix_snapshots': {
          const snaps = [];
          checkSnapshots(step, state.batch);
          const wanted = (i, j) => (step.snap_seq || []).flatMap((s, m) => (s === i && step.snap_offset[m] === j ? [m] : []));
          const { trace, rows } = layer.packed(st.tensors[`calls.${step.call}.x`], state, step.cu_seqlens, step.seq_pos,
            step.slots, (i, j, row) => wanted(i, j).forEach((m) => snaps.push([step.snap_slot[m], GDNLayer.cloneState(row)])));
          step.slots.forEach((slot, i) => { if (slot !== PAD_SLOT_ID) layer.putRow(state, slot, rows[i]); });
          for (const [dest, row] of snaps) layer.putRow(state, dest, row);
          keep(outputs, step, trace, layer, state);
          break;
        }
        case 'verify_spec': { // every token's state kept for the commit; the pool is not written
          const steps = step.slots.map(() => []);
          const { trace } = layer.packed(st.tensors[`calls.${step.call}.x`], state, step.cu_seqlens, step.seq_pos,
            step.slots, (i, j, row) => { steps[i][j] = GDNLayer.cloneState(row); });
          verifies[step.call] = { slots: step.slots, steps };
          keep(outputs, step, trace, layer, state);
          break;
        }
        case 'forward_mixed': { // verify rows (verify[i] = 1) as verify_spec, plain rows as forward_packed
          const steps = step.slots.map(() => []);
          const { trace, rows } = layer.packed(st.tensors[`calls.${step.call}.x`], state, step.cu_seqlens, step.seq_pos,
            step.slots, (i, j, row) => { if (step.verify[i]) steps[i][j] = GDNLayer.cloneState(row); });
          step.slots.forEach((slot, i) => { if (slot !== PAD_SLOT_ID && !step.verify[i]) layer.putRow(state, slot, rows[i]); });
          // a plain row has nothing to commit: 0 draft tokens
          verifies[step.call] = { slots: step.slots, steps: steps.map((s, i) => (step.verify[i] ? s : [null])) };
          keep(outputs, step, trace, layer, state);
          break;
        }
        case 'commit': {
          const v = verifies[step.of_call];
          delete verifies[step.of_call];
          step.accepted.forEach((n, i) => {
            const k = v.steps[i].length - 1;
            if (!Number.isInteger(n) || n < 0 || n > k) throw new GDNError('accept_count', `sequence ${i}: accepted ${n}, expected 0..${k} (its draft tokens)`);
          });
          (step.snap_seq || []).forEach((i, m) => {
            const o = step.snap_offset[m];
            if (!(o >= 1 && o <= step.accepted[i])) throw new GDNError('snapshot_request', `request ${m}: offset ${o}, expected 1..${step.accepted[i]} (sequence ${i}'s accepted tokens)`);
          });
          // destinations: real slots, distinct, never a slot of the call committed (a verify row's or a plain row's)
          (step.snap_slot || []).forEach((dest, m) => {
            if (!Number.isInteger(dest) || dest < 0 || dest >= state.batch) throw new GDNError('slot_index', `request ${m}: destination slot ${dest} is not in [0, ${state.batch})`);
            const row = v.slots.indexOf(dest);
            if (row >= 0 || step.snap_slot.indexOf(dest) < m) throw new GDNError('duplicate_slot', `request ${m}: destination slot ${dest} is also ${row >= 0 ? `sequence ${row}'s slot` : 'an earlier request\'s destination'}`);
          });
          v.slots.forEach((slot, i) => {
            const n = step.accepted[i];
            if (slot !== PAD_SLOT_ID && n > 0) layer.putRow(state, slot, v.steps[i][n]);
          });
          // prefix snapshots inside (or at the end of) the accepted windows
          (step.snap_seq || []).forEach((i, m) => layer.putRow(state, step.snap_slot[m], v.steps[i][step.snap_offset[m]]));
          keep(outputs, step, {}, layer, state);
          break;
        }
        case 'free':
          GDNLayer.checkFree(step.slots, state.batch);
          for (const slot of step.slots) layer.putRow(state, slot, layer.newState(1));
          break;
        default:
          throw new Error(`unknown program step ${step.op}`);
      }
    }
    return { outputs, error: null };
  } catch (err) {
    return { outputs, error: { code: err instanceof GDNError ? err.code : err.name, message: err.message, step: i } };
  }
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.help || !args.out) {
    console.log('usage: node run.js --fixtures DIR --out DIR [--case ID_OR_PREFIX ...]');
    return args.help ? 0 : 2;
  }
  const dir = resolve(args.fixtures);
  const { have, writtenFor } = featuresFromEnv(process.env.GDN_NODE_FEATURES);
  const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  if (manifest.format !== 'gdncheck-fixtures' || !readableVersion(manifest.format_version)) {
    throw new Error(`${dir}/manifest.json: format ${manifest.format} v${manifest.format_version}, this runner reads gdncheck-fixtures 1 and 1.N`);
  }
  mkdirSync(args.out, { recursive: true });
  // the command that made the outputs (data: verify repeats only a `gdncheck run` command in repro lines)
  const command = `node examples/ports/node/run.js --fixtures ${args.fixtures} --out ${args.out}`;
  let unusable = 0;
  for (const entry of manifest.cases) {
    if (args.cases.length && !args.cases.some((c) => entry.id.startsWith(c))) continue;
    const t0 = performance.now();
    let st;
    let outPath;
    try {
      if (typeof entry.id !== 'string' || !CASE_ID.test(entry.id)) {
        throw new Error(`case id ${JSON.stringify(entry.id)} is not a case id (${CASE_ID}): its outputs file would leave --out`);
      }
      outPath = outFile(args.out, `${entry.id}.safetensors`, 'outputs file');
      st = readCase(dir, entry);
    } catch (err) {
      unusable++;
      console.log(`skipped  ${entry.id}: ${err.message}`);
      continue;
    }
    const na = notApplicable(entry, have, manifest.features);
    const { outputs, error } = runCase(st, entry, args.out, na ? na.step : Infinity);
    const meta = {
      format: 'gdncheck-outputs', format_version: OUTPUTS_FORMAT_VERSION, case: entry.id, fixture_sha256: entry.sha256,
      implementation: 'node-f32 (examples/ports/node)', profile: 'f32', device: `cpu, Node.js ${process.version}`,
      command,
    };
    if (writtenFor) meta.fixture_format_version = writtenFor; // FORMAT.md §7: the format this runner was written for
    if (error) Object.assign(meta, { error_code: error.code, error_message: error.message, error_step: String(error.step) });
    else if (na) Object.assign(meta, { not_applicable: na.reason, not_applicable_step: String(na.step) });
    writeSafetensors(outPath, outputs, meta);
    const ms = (performance.now() - t0).toFixed(0);
    const said = error ? `: ${error.code} at step ${error.step}: ${error.message}` : na ? `: not applicable from step ${na.step}: ${na.reason}` : '';
    console.log(`${error ? 'raised' : na ? 'n/a   ' : 'ran   '}   ${entry.id} (${ms} ms)${said}`);
  }
  return unusable ? 2 : 0;
}

process.exitCode = main();
