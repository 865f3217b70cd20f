// What this runner implements of the fixture format, and the not-applicable rule of FORMAT.md §7:
// a case that requires a feature the runner does not implement, or whose step carries a field the
// runner does not read, is declared not applicable from that step, never run with the field ignored.
//
// GDN_NODE_FEATURES selects an older feature set, to try the rule (tests/ports/test_node_port.py):
//   GDN_NODE_FEATURES=1.1                         the runner as written for fixture format 1.1
//   GDN_NODE_FEATURES=packed_calls,spec_decode    exactly these features
// unset or empty: everything below (fixture format 1.2). The template implements no `sharded` (format 1.3,
// FORMAT.md §4.2): a sharded case's `requires` names it, so the case is not applicable from its `shard` step
// ("requires sharded (format 1.3)", the version read from the manifest's `features`), whatever is selected.

// Each feature with the format version that added it (FORMAT.md, Changelog).
export const FEATURES = {
  snapshot_files: '1.0', strict_mode: '1.0', moe: '1.0', packed_calls: '1.0', spec_decode: '1.0',
  prefix_snapshots: '1.0', mixed_batches: '1.1', commit_snapshots: '1.2',
};
export const WRITTEN_FOR = '1.2';

// The fields the runner reads per program op (FORMAT.md §4, §4.1), each with the feature it needs
// beyond the op's own ('' for none).
const CALL = ['call', 'T', 'seq_pos', 'tokens', 'seq_len_after', 'expected'];
const PACKED = [...CALL, 'cu_seqlens', 'slots', 'requests'];
const SNAPS = ['snap_seq', 'snap_offset', 'snap_slot'];
const fields = (names, feature = '') => Object.fromEntries(names.map((n) => [n, feature]));
const OPS = {
  construct: { needs: [], fields: { strict: '', pool_size: 'packed_calls' } },
  reset: { needs: [], fields: {} },
  forward: { needs: [], fields: fields(CALL) },
  decode: { needs: [], fields: fields(CALL) },
  snapshot: { needs: [], fields: fields(['slot', 'state_of_call']) },
  restore: { needs: [], fields: fields(['slot']) },
  save: { needs: ['snapshot_files'], fields: fields(['slot', 'file', 'state_of_call']) },
  load: { needs: ['snapshot_files'], fields: fields(['slot', 'file']) },
  forward_packed: { needs: ['packed_calls'], fields: fields(PACKED) },
  free: { needs: ['packed_calls'], fields: fields(['slots']) },
  verify_spec: { needs: ['packed_calls', 'spec_decode'], fields: fields(PACKED) },
  prefix_snapshots: { needs: ['packed_calls', 'prefix_snapshots'], fields: fields([...PACKED, ...SNAPS]) },
  forward_mixed: { needs: ['packed_calls', 'spec_decode', 'mixed_batches'], fields: fields([...PACKED, 'verify']) },
  commit: {
    needs: ['packed_calls', 'spec_decode'],
    fields: { ...fields(['call', 'of_call', 'accepted', 'seq_pos', 'slots', 'T', 'seq_len_after', 'expected']),
      verify: 'mixed_batches', ...fields(SNAPS, 'commit_snapshots') },
  },
};

const versionKey = (v) => v.split('.').map(Number);
const notNewer = (a, b) => { const [x, y] = versionKey(a); const [p, q] = versionKey(b); return x < p || (x === p && y <= q); };

// The features and the version to claim, from GDN_NODE_FEATURES.
export function featuresFromEnv(text) {
  if (text === undefined || text.trim() === '') return { have: new Set(Object.keys(FEATURES)), writtenFor: WRITTEN_FOR };
  const t = text.trim();
  if (/^[0-9]+\.[0-9]+$/.test(t)) {
    if (!notNewer('1.0', t) || !notNewer(t, WRITTEN_FOR)) {
      throw new Error(`GDN_NODE_FEATURES: expected a fixture format version 1.0 to ${WRITTEN_FOR} or feature names, found ${JSON.stringify(text)}`);
    }
    return { have: new Set(Object.keys(FEATURES).filter((f) => notNewer(FEATURES[f], t))), writtenFor: t };
  }
  const names = t.split(',').map((s) => s.trim()).filter(Boolean);
  const bad = names.filter((n) => !(n in FEATURES));
  if (bad.length) throw new Error(`GDN_NODE_FEATURES: expected a version or feature names of ${Object.keys(FEATURES).join(', ')}, found ${JSON.stringify(bad[0])}`);
  return { have: new Set(names), writtenFor: null };
}

// Whether this runner can run the case as written: null, or {step, reason} for the first step it
// cannot (a feature of `requires` it lacks, a step or field it does not read).
export function notApplicable(entry, have, manifestFeatures) {
  let stop = null;
  const at = (step, reason) => { if (stop === null || step < stop.step) stop = { step, reason }; };
  const req = entry.requires && typeof entry.requires === 'object' ? entry.requires : {};
  const missing = Object.keys(req).filter((f) => !have.has(f)).sort((a, b) => req[a] - req[b]);
  if (missing.length) {
    const since = (f) => FEATURES[f] ?? manifestFeatures?.[f]?.since;
    at(Math.min(...missing.map((f) => req[f])), `requires ${missing.map((f) => (since(f) ? `${f} (format ${since(f)})` : f)).join(', ')}`);
  }
  entry.program.forEach((step, i) => {
    const op = OPS[step.op];
    if (!op) return at(i, `step ${i} is op ${JSON.stringify(step.op)}, which this runner does not read`);
    const lacking = op.needs.filter((f) => !have.has(f));
    if (lacking.length) return at(i, `requires ${lacking.map((f) => `${f} (format ${FEATURES[f]})`).join(', ')}`);
    if (step.op === 'construct' && step.strict === true && !have.has('strict_mode')) return at(i, 'requires strict_mode (format 1.0)');
    for (const name of Object.keys(step)) {
      if (name === 'op') continue;
      if (!(name in op.fields)) return at(i, `step ${i} (${step.op}) carries field ${name}, which this runner does not read`);
      const f = op.fields[name];
      if (f && !have.has(f)) return at(i, `requires ${f} (format ${FEATURES[f]})`);
    }
    return undefined;
  });
  if (entry.config?.num_experts && !have.has('moe') && !('moe' in req)) at(0, 'requires moe (format 1.0)');
  return stop;
}

// A manifest this runner reads: format_version 1 (before minor versions) or "1.N" (a newer minor too:
// its cases that need what the runner does not know are not applicable, above).
export function readableVersion(v) {
  return v === 1 || (typeof v === 'string' && /^1\.[0-9]+$/.test(v));
}
