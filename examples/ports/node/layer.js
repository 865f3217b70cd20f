// One Qwen3.5 Gated DeltaNet layer in float32, token by token (the recurrent rule), written from
// fixtures/FORMAT.md alone: the config and weight checks of §6, the stages of §5, the state and the
// seq-len rule of §4. Every value is a float32: Float32Array storage and Math.fround after each
// operation (products, sums, exp, sqrt), as a WebGPU shader computing in f32 would.

const f = Math.fround;

// The padding slot id of a packed call (docs/serving.md): vLLM's and SGLang's PAD_SLOT_ID.
export const PAD_SLOT_ID = -1;

export class GDNError extends Error {
  // `code` is one of the stable codes of FORMAT.md §6; verify reads it from the outputs' metadata.
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

const HEAD_KEYS = ['linear_num_key_heads', 'linear_num_value_heads', 'linear_key_head_dim', 'linear_value_head_dim'];
export const WEIGHT_NAMES = [
  'input_layernorm.weight', 'linear_attn.in_proj_qkv.weight', 'linear_attn.in_proj_z.weight',
  'linear_attn.in_proj_a.weight', 'linear_attn.in_proj_b.weight', 'linear_attn.conv1d.weight', 'linear_attn.dt_bias',
  'linear_attn.A_log', 'linear_attn.norm.weight', 'linear_attn.out_proj.weight', 'post_attention_layernorm.weight',
  'mlp.gate_proj.weight', 'mlp.up_proj.weight', 'mlp.down_proj.weight',
];
// The sparse (MoE) block in place of the dense MLP (docs/moe.md): transformers' in-memory names.
export const MOE_WEIGHT_NAMES = [
  'mlp.gate.weight', 'mlp.experts.gate_up_proj', 'mlp.experts.down_proj', 'mlp.shared_expert.gate_proj.weight',
  'mlp.shared_expert.up_proj.weight', 'mlp.shared_expert.down_proj.weight', 'mlp.shared_expert_gate.weight',
];
const ALWAYS_SPARSE = new Set(['qwen3_5_moe', 'qwen3_5_moe_text']);
const NORM_MODES = { shared: 'shared', per_head: 'per_head', 'per-head': 'per_head', perhead: 'per_head' };

function positiveInt(config, key, code) {
  const v = config[key];
  if (v === undefined || v === null) throw new GDNError(code, `config key ${key} is required, found it missing`);
  if (!Number.isInteger(v) || v <= 0) throw new GDNError('config_error', `config key ${key} must be a positive integer, found ${v}`);
  return v;
}

// The Hugging Face config dict (FORMAT.md §1) -> dimensions; the config errors of §6.
export function parseConfig(config) {
  const missing = HEAD_KEYS.filter((k) => config[k] === undefined || config[k] === null);
  if (missing.length) {
    throw new GDNError('missing_head_setting', `a GDN layer needs ${HEAD_KEYS.join(', ')}; missing: ${missing.join(', ')}`);
  }
  const c = {
    D: positiveInt(config, 'hidden_size', 'missing_config_key'),
    I: null,
    Hk: positiveInt(config, 'linear_num_key_heads', 'missing_head_setting'),
    Hv: positiveInt(config, 'linear_num_value_heads', 'missing_head_setting'),
    dk: positiveInt(config, 'linear_key_head_dim', 'missing_head_setting'),
    dv: positiveInt(config, 'linear_value_head_dim', 'missing_head_setting'),
    K: config.linear_conv_kernel_dim === undefined ? 4 : positiveInt(config, 'linear_conv_kernel_dim', 'missing_config_key'),
    eps: config.rms_norm_eps === undefined ? 1e-6 : config.rms_norm_eps,
    normMode: null,
  };
  if (typeof c.eps !== 'number' || !Number.isFinite(c.eps) || c.eps <= 0) {
    throw new GDNError('invalid_eps', `rms_norm_eps must be a positive finite number, found ${c.eps}`);
  }
  if (c.Hv % c.Hk !== 0) {
    throw new GDNError('head_ratio', `linear_num_value_heads (${c.Hv}) must be a multiple of linear_num_key_heads (${c.Hk})`);
  }
  if (config.linear_norm_mode !== undefined && config.linear_norm_mode !== null) {
    c.normMode = NORM_MODES[String(config.linear_norm_mode).trim().toLowerCase()];
    if (!c.normMode) {
      throw new GDNError('unknown_norm_mode', `linear_norm_mode must be shared or per_head (aliases per-head, perhead), found ${JSON.stringify(config.linear_norm_mode)}`);
    }
  }
  parseMoE(config, c);
  if (!c.moe) c.I = positiveInt(config, 'intermediate_size', 'missing_config_key');
  c.keyDim = c.Hk * c.dk;
  c.valueDim = c.Hv * c.dv;
  c.convDim = 2 * c.keyDim + c.valueDim;
  c.r = c.Hv / c.Hk;
  return c;
}

// The sparse block's keys (docs/moe.md, "Configuration"): whether layer 0 is sparse, and its sizes.
// Qwen3.5-MoE (model_type qwen3_5_moe[_text]) is sparse in every layer and always renormalises;
// otherwise (Qwen3-Next) layer 0 is sparse when num_experts > 0, 0 is not in mlp_only_layers and
// decoder_sparse_step is 1.
function parseMoE(config, c) {
  c.moe = false;
  const E = config.num_experts;
  const always = ALWAYS_SPARSE.has(String(config.model_type || ''));
  if (E === undefined || E === null) {
    if (always) throw new GDNError('missing_config_key', 'config key num_experts is required, found it missing');
    return;
  }
  if (!Number.isInteger(E) || E < 0 || (E === 0 && always)) {
    throw new GDNError('expert_count', `expected num_experts >= 1 for a sparse MLP block, found ${E}`);
  }
  const step = config.decoder_sparse_step ?? 1;
  const only = config.mlp_only_layers ?? [];
  const renorm = config.norm_topk_prob ?? true;
  if (typeof renorm !== 'boolean' || !Array.isArray(only) || !Number.isInteger(step) || step < 1) {
    throw new GDNError('moe_config', 'norm_topk_prob must be a boolean, mlp_only_layers a list, decoder_sparse_step a positive integer');
  }
  if (always && (renorm !== true || step !== 1 || only.length)) {
    throw new GDNError('moe_config', `model_type ${config.model_type} is sparse in every layer and always renormalises: norm_topk_prob, decoder_sparse_step and mlp_only_layers must be absent or true, 1, []`);
  }
  if (E === 0 || only.includes(0) || 1 % step !== 0) return; // layer 0 keeps the dense MLP
  c.moe = true;
  c.E = E;
  c.topK = positiveInt(config, 'num_experts_per_tok', 'missing_config_key');
  if (c.topK > E) throw new GDNError('moe_top_k', `num_experts_per_tok must be an integer in [1, num_experts = ${E}], found ${c.topK}`);
  c.Im = positiveInt(config, 'moe_intermediate_size', 'missing_config_key');
  c.Is = positiveInt(config, 'shared_expert_intermediate_size', 'missing_config_key');
  c.renorm = renorm;
}

// The weight errors of §6, in this order: missing, conv kernel, projection size, norm size and mode,
// every other shape. Returns the resolved norm mode.
function checkWeights(c, weights) {
  const missing = weightNames(c).filter((n) => !(n in weights));
  if (missing.length) throw new GDNError('missing_weight', `missing weight(s): ${missing.join(', ')}`);
  const shape = (n) => weights[n].shape;
  const conv = shape('linear_attn.conv1d.weight');
  if (conv[conv.length - 1] !== c.K) {
    throw new GDNError('conv_kernel_mismatch', `linear_conv_kernel_dim is ${c.K} but conv1d.weight ${JSON.stringify(conv)} has kernel ${conv[conv.length - 1]}`);
  }
  const qkv = shape('linear_attn.in_proj_qkv.weight');
  if (qkv[0] !== c.convDim || conv[0] !== c.convDim) {
    throw new GDNError('projection_size', `expected in_proj_qkv rows [${c.keyDim}, ${c.keyDim}, ${c.valueDim}] = ${c.convDim}, found ${qkv[0]} (conv1d channels ${conv[0]})`);
  }
  const normSize = weights['linear_attn.norm.weight'].data.length;
  const inferred = normSize === c.dv ? 'shared' : normSize === c.valueDim ? 'per_head' : null;
  if (!inferred) {
    throw new GDNError('norm_weight_size', `linear_attn.norm.weight has ${normSize} elements, expected ${c.dv} (shared) or ${c.valueDim} (per_head)`);
  }
  let mode = inferred;
  if (c.normMode && c.normMode !== inferred) {
    if (!(normSize === c.dv && normSize === c.valueDim)) { // one value head: both readings hold
      throw new GDNError('norm_mode_conflict', `layer 0 declares linear_norm_mode=${c.normMode} but norm.weight's ${normSize} elements imply ${inferred}`);
    }
    mode = c.normMode;
  }
  const want = {
    'input_layernorm.weight': [c.D], 'linear_attn.in_proj_qkv.weight': [c.convDim, c.D],
    'linear_attn.in_proj_z.weight': [c.valueDim, c.D], 'linear_attn.in_proj_a.weight': [c.Hv, c.D],
    'linear_attn.in_proj_b.weight': [c.Hv, c.D], 'linear_attn.conv1d.weight': [c.convDim, 1, c.K],
    'linear_attn.dt_bias': [c.Hv], 'linear_attn.A_log': [c.Hv], 'linear_attn.out_proj.weight': [c.D, c.valueDim],
    'post_attention_layernorm.weight': [c.D],
    ...(c.moe ? {
      'mlp.gate.weight': [c.E, c.D], 'mlp.experts.gate_up_proj': [c.E, 2 * c.Im, c.D],
      'mlp.experts.down_proj': [c.E, c.D, c.Im], 'mlp.shared_expert.gate_proj.weight': [c.Is, c.D],
      'mlp.shared_expert.up_proj.weight': [c.Is, c.D], 'mlp.shared_expert.down_proj.weight': [c.D, c.Is],
      'mlp.shared_expert_gate.weight': [1, c.D],
    } : { 'mlp.gate_proj.weight': [c.I, c.D], 'mlp.up_proj.weight': [c.I, c.D], 'mlp.down_proj.weight': [c.D, c.I] }),
  };
  for (const [name, s] of Object.entries(want)) {
    if (JSON.stringify(shape(name)) !== JSON.stringify(s)) {
      throw new GDNError('weight_shape', `weight ${name}: expected shape ${JSON.stringify(s)}, found ${JSON.stringify(shape(name))}`);
    }
  }
  return mode;
}

function weightNames(c) {
  return c.moe ? WEIGHT_NAMES.filter((n) => !n.startsWith('mlp.')).concat(MOE_WEIGHT_NAMES) : WEIGHT_NAMES;
}

// --- float32 building blocks ---------------------------------------------------------------------

// Reductions are summed the way a GPU workgroup sums them: LANES partial sums over strided elements,
// then a pairwise tree over the partials, all in float32. GDN_NODE_LANES=1 gives one sequential
// float32 accumulator, as a naive kernel loop sums: also a float32 implementation, and it conforms too
// (the f32 bounds were derived over several summation orders), but its error grows with the length.
function lanesFromEnv(text) {
  if (text === undefined || text === '') return 64;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) {
    throw new Error(`GDN_NODE_LANES: expected a positive integer (partial sums per reduction), found ${JSON.stringify(text)}`);
  }
  return n;
}
const LANES = lanesFromEnv(process.env.GDN_NODE_LANES);
const partial = new Float32Array(LANES);

function treeSum(p, n) { // pairwise sum of p[0..n), in float32
  for (let width = n; width > 1; width = (width + 1) >> 1) {
    const half = width >> 1;
    for (let l = 0; l < half; l++) p[l] = f(p[l] + p[l + ((width + 1) >> 1)]);
  }
  return n ? p[0] : 0;
}

function dot(a, ai, b, bi, n) { // sum_i a[ai+i] * b[bi+i] in float32
  const lanes = Math.min(LANES, n);
  for (let l = 0; l < lanes; l++) {
    let acc = 0;
    for (let i = l; i < n; i += lanes) acc = f(acc + f(a[ai + i] * b[bi + i]));
    partial[l] = acc;
  }
  return treeSum(partial, lanes);
}

function matvec(w, rows, cols, x, xi, out, oi) { // out = W x, W [rows, cols] row-major
  for (let r = 0; r < rows; r++) out[oi + r] = dot(w, r * cols, x, xi, cols);
}

const sigmoid = (u) => f(1 / f(1 + f(Math.exp(-u))));
const silu = (u) => f(u * sigmoid(u));
const softplus = (x) => f(x > 0 ? x + Math.log1p(Math.exp(-x)) : Math.log1p(Math.exp(x))); // exact log(1 + e^x)

// RMSNorm over n values: x / sqrt(mean(x^2) + eps) * w' (w' = 1 + w for the layer norms, w for the gated norm)
function rmsNorm(x, xi, n, w, wi, eps, out, oi) {
  const ss = dot(x, xi, x, xi, n);
  const inv = f(1 / f(Math.sqrt(f(f(ss / n) + eps))));
  for (let i = 0; i < n; i++) out[oi + i] = f(f(x[xi + i] * inv) * w[wi + i]);
}

function l2Normalize(x, xi, n) { // u / sqrt(sum(u^2) + 1e-6), in place
  const ss = dot(x, xi, x, xi, n);
  const inv = f(1 / f(Math.sqrt(f(ss + 1e-6))));
  for (let i = 0; i < n; i++) x[xi + i] = f(x[xi + i] * inv);
}

// --- the layer -----------------------------------------------------------------------------------

export class GDNLayer {
  // config: the case's Hugging Face config dict; weights: { name: { shape, data: Float32Array } }.
  constructor(config, weights, { strict = false } = {}) {
    this.c = parseConfig(config);
    this.normMode = checkWeights(this.c, weights);
    this.strict = strict;
    const w = (n) => weights[n].data;
    const c = this.c;
    this.w = Object.fromEntries(weightNames(c).map((n) => [n, w(n)]));
    const onePlus = (a) => Float32Array.from(a, (v) => f(1 + v)); // the layer RMSNorms apply (1 + w)
    this.wIn = onePlus(w('input_layernorm.weight'));
    this.wPost = onePlus(w('post_attention_layernorm.weight'));
    this.negA = Float32Array.from(w('linear_attn.A_log'), (v) => f(-Math.exp(v)));
    this.scale = f(1 / Math.sqrt(c.dk));
    this.warned = new WeakSet();
  }

  newState(batch) {
    const c = this.c;
    return {
      batch,
      conv: new Float32Array(batch * c.convDim * c.K), // [B, conv_dim, K], oldest column first
      rec: new Float32Array(batch * c.Hv * c.dk * c.dv), // [B, Hv, dk, dv]
      seqLen: new Array(batch).fill(0),
    };
  }

  static cloneState(s) {
    return { batch: s.batch, conv: s.conv.slice(), rec: s.rec.slice(), seqLen: s.seqLen.slice() };
  }

  // Every stage tensor of a call, zeros, shaped [...lead, ...per-token shape] (lead: [B, T], or [T] packed).
  traceOf(lead) {
    const c = this.c;
    const shapes = {
      x_norm: [c.D], qkv: [c.convDim], z: [c.Hv, c.dv], a: [c.Hv], b: [c.Hv], qkv_conv: [c.convDim],
      q: [c.Hk, c.dk], k: [c.Hk, c.dk], v: [c.Hv, c.dv], g: [c.Hv], beta: [c.Hv], core: [c.Hv, c.dv],
      core_gated: [c.Hv, c.dv], attn_out: [c.D], h: [c.D], h_norm: [c.D], mlp_out: [c.D], out: [c.D],
      ...(c.moe ? { router_logits: [c.E], routing_weights: [c.topK], selected_experts: [c.topK], experts_out: [c.D],
        shared_out: [c.D] } : {}),
    };
    const tokens = lead.reduce((p, q) => p * q, 1);
    const trace = {};
    for (const [name, s] of Object.entries(shapes)) {
      const n = s.reduce((p, q) => p * q, 1);
      trace[name] = { shape: [...lead, ...s], data: new Float32Array(tokens * n), n };
    }
    return trace;
  }

  // x: { dtype, shape: [B, T, D], data }; seqPos: B first-token positions. Returns the stage tensors,
  // each { shape, data: Float32Array } batch first, and updates `state` in place.
  forward(x, state, seqPos) {
    const c = this.c;
    if (!['F32', 'F64', 'BF16', 'F16'].includes(x.dtype)) {
      throw new GDNError('input_dtype', `x must be floating point, found ${x.dtype}`);
    }
    if (x.shape.length !== 3 || x.shape[0] !== state.batch || x.shape[1] < 1 || x.shape[2] !== c.D) {
      throw new GDNError('input_shape', `x must be [B=${state.batch}, T>=1, D=${c.D}], found ${JSON.stringify(x.shape)}`);
    }
    const [B, T] = x.shape;
    this.applySeqLenRule(state, seqPos);
    const trace = this.traceOf([B, T]);
    for (let b = 0; b < B; b++) {
      for (let t = 0; t < T; t++) this.token(x.data, (b * T + t) * c.D, state, b, trace, b * T + t);
      state.seqLen[b] = seqPos[b] + T;
    }
    for (const v of Object.values(trace)) delete v.n;
    return trace;
  }

  // A packed call (docs/serving.md, FORMAT.md §4.1). x: { shape: [T, D], data }, the tokens of N
  // sequences one after another: sequence i is rows cu[i] .. cu[i+1]-1, at position seqPos[i], its state
  // in row slots[i] of `pool` (a state whose rows are slots; -1: a padding sequence, computed from a
  // zero state). Every sequence runs on a one-row copy of its slot, so nothing is written to the pool
  // here: the caller stores the returned rows (a strict-mode refusal, raised before any token, changes
  // nothing). `after(i, j, row)`, if given, sees sequence i's one-row state after its first j tokens.
  // Returns { trace (each stage tensor [T, ...]), rows }.
  packed(x, pool, cu, seqPos, slots, after = null) {
    const c = this.c;
    if (!['F32', 'F64', 'BF16', 'F16'].includes(x.dtype)) {
      throw new GDNError('input_dtype', `x must be floating point, found ${x.dtype}`);
    }
    const N = slots.length;
    if (x.shape.length !== 2 || x.shape[1] !== c.D || x.shape[0] !== cu[N]) {
      throw new GDNError('input_shape', `packed x must be [T=${cu[N]}, D=${c.D}], found ${JSON.stringify(x.shape)}`);
    }
    GDNLayer.checkSlots(slots, pool.batch);
    for (let i = 0; i < N; i++) {
      if (cu[i + 1] <= cu[i]) throw new GDNError('empty_sequence', `packed sequence ${i} holds no token (cu_seqlens ${JSON.stringify(cu)})`);
    }
    const rows = slots.map((slot, i) => { // the seq-len rule per slot, for every sequence before any token
      const one = this.newState(1);
      if (slot === PAD_SLOT_ID) {
        one.seqLen[0] = seqPos[i];
        return one;
      }
      one.conv.set(pool.conv.subarray(slot * c.convDim * c.K, (slot + 1) * c.convDim * c.K));
      one.rec.set(pool.rec.subarray(slot * c.Hv * c.dk * c.dv, (slot + 1) * c.Hv * c.dk * c.dv));
      one.seqLen[0] = pool.seqLen[slot];
      if (one.seqLen[0] !== seqPos[i] && this.strict) {
        throw new GDNError('seq_pos_mismatch', `sequence ${i} (slot ${slot}): seq_pos ${seqPos[i]} but the slot holds ${one.seqLen[0]} tokens (strict mode)`);
      }
      this.applySeqLenRule(one, [seqPos[i]]);
      return one;
    });
    const trace = this.traceOf([cu[N]]);
    for (let i = 0; i < N; i++) {
      for (let t = cu[i]; t < cu[i + 1]; t++) {
        this.token(x.data, t * c.D, rows[i], 0, trace, t); // the conv window is this sequence's own
        rows[i].seqLen[0] = seqPos[i] + t - cu[i] + 1;
        if (after) after(i, t - cu[i] + 1, rows[i]);
      }
    }
    for (const v of Object.values(trace)) delete v.n;
    return { trace, rows };
  }

  // The slots of a packed call (docs/serving.md §3): each -1 (padding) or in [0, S), none named twice.
  static checkSlots(slots, S) {
    const seen = new Set();
    slots.forEach((slot, i) => {
      if (!Number.isInteger(slot) || (slot !== PAD_SLOT_ID && (slot < 0 || slot >= S))) {
        throw new GDNError('slot_index', `sequence ${i}: slot ${slot} is neither -1 nor in [0, ${S})`);
      }
      if (slot !== PAD_SLOT_ID && seen.has(slot)) throw new GDNError('duplicate_slot', `slot ${slot} named twice in one call`);
      seen.add(slot);
    });
  }

  // `free`: every id a slot in [0, S); -1 names no slot (and would index the last one in many languages).
  static checkFree(slots, S) {
    for (const slot of slots) {
      if (!Number.isInteger(slot) || slot < 0 || slot >= S) throw new GDNError('slot_index', `free: slot ${slot} is not in [0, ${S})`);
    }
  }

  // Copy a one-row state into row `slot` of the pool.
  putRow(pool, slot, one) {
    const c = this.c;
    pool.conv.set(one.conv, slot * c.convDim * c.K);
    pool.rec.set(one.rec, slot * c.Hv * c.dk * c.dv);
    pool.seqLen[slot] = one.seqLen[0];
  }

  // The seq-len rule (FORMAT.md §4): a row whose state holds another number of tokens than the call's
  // first position is reset to zeros (strict mode: an error).
  applySeqLenRule(state, seqPos) {
    const c = this.c;
    for (let b = 0; b < state.batch; b++) {
      if (state.seqLen[b] === seqPos[b]) continue;
      if (this.strict) {
        throw new GDNError('seq_pos_mismatch', `row ${b}: seq_pos ${seqPos[b]} but the state holds ${state.seqLen[b]} tokens (strict mode)`);
      }
      if (!this.warned.has(state)) {
        this.warned.add(state);
        if (process.env.GDN_NODE_VERBOSE) console.warn(`linear_attention state mismatch: row ${b} seq_len ${state.seqLen[b]}, seq_pos ${seqPos[b]}: resetting`);
      }
      state.conv.fill(0, b * c.convDim * c.K, (b + 1) * c.convDim * c.K);
      state.rec.fill(0, b * c.Hv * c.dk * c.dv, (b + 1) * c.Hv * c.dk * c.dv);
      state.seqLen[b] = seqPos[b];
    }
  }

  // One token of row b: every stage of FORMAT.md §5, written to trace[name].data at token slot `i`.
  token(x, xi, state, b, trace, i) {
    const { c, w } = this;
    const at = (name) => [trace[name].data, i * trace[name].n];
    const [xn, xno] = at('x_norm');
    rmsNorm(x, xi, c.D, this.wIn, 0, c.eps, xn, xno); // 1 input_norm
    const [qkv, qkvo] = at('qkv'); const [z, zo] = at('z'); const [a, ao] = at('a'); const [bb, bo] = at('b');
    matvec(w['linear_attn.in_proj_qkv.weight'], c.convDim, c.D, xn, xno, qkv, qkvo); // 2 in_proj
    matvec(w['linear_attn.in_proj_z.weight'], c.valueDim, c.D, xn, xno, z, zo);
    matvec(w['linear_attn.in_proj_a.weight'], c.Hv, c.D, xn, xno, a, ao);
    matvec(w['linear_attn.in_proj_b.weight'], c.Hv, c.D, xn, xno, bb, bo);
    // 3 conv1d: shift the K-column window left, append this token's qkv, silu(sum_j w[ch, j] window[j])
    const [qc, qco] = at('qkv_conv');
    const cw = w['linear_attn.conv1d.weight'];
    for (let ch = 0; ch < c.convDim; ch++) {
      const s = (b * c.convDim + ch) * c.K;
      for (let j = 0; j < c.K - 1; j++) state.conv[s + j] = state.conv[s + j + 1];
      state.conv[s + c.K - 1] = qkv[qkvo + ch];
      qc[qco + ch] = silu(dot(cw, ch * c.K, state.conv, s, c.K));
    }
    // 4 qk_norm: split [Q | K | V]; L2-normalise each q and k head (q is not scaled here)
    const [q, qo] = at('q'); const [k, ko] = at('k'); const [v, vo] = at('v');
    q.set(qc.subarray(qco, qco + c.keyDim), qo);
    k.set(qc.subarray(qco + c.keyDim, qco + 2 * c.keyDim), ko);
    v.set(qc.subarray(qco + 2 * c.keyDim, qco + c.convDim), vo);
    for (let h = 0; h < c.Hk; h++) { l2Normalize(q, qo + h * c.dk, c.dk); l2Normalize(k, ko + h * c.dk, c.dk); }
    // 5 gates: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
    const [g, go] = at('g'); const [beta, betao] = at('beta');
    const dtBias = w['linear_attn.dt_bias'];
    for (let h = 0; h < c.Hv; h++) {
      g[go + h] = f(this.negA[h] * softplus(f(a[ao + h] + dtBias[h])));
      beta[betao + h] = sigmoid(bb[bo + h]);
    }
    // 6 delta_rule, per value head j reading key head j / r: decay, read, delta, write, read
    const [core, coreo] = at('core');
    const m = new Float32Array(c.dv);
    for (let j = 0; j < c.Hv; j++) {
      const S = state.rec.subarray((b * c.Hv + j) * c.dk * c.dv, (b * c.Hv + j + 1) * c.dk * c.dv);
      const kh = Math.floor(j / c.r);
      const kj = ko + kh * c.dk; const qj = qo + kh * c.dk; const vj = vo + j * c.dv;
      const decay = f(Math.exp(g[go + j]));
      for (let e = 0; e < S.length; e++) S[e] = f(S[e] * decay); // 1. S <- exp(g) S
      m.fill(0);
      for (let r = 0; r < c.dk; r++) { // 2. m = k^T S
        for (let col = 0; col < c.dv; col++) m[col] = f(m[col] + f(k[kj + r] * S[r * c.dv + col]));
      }
      for (let col = 0; col < c.dv; col++) m[col] = f(beta[betao + j] * f(v[vj + col] - m[col])); // 3. delta
      for (let r = 0; r < c.dk; r++) { // 4. S <- S + k (x) delta
        for (let col = 0; col < c.dv; col++) S[r * c.dv + col] = f(S[r * c.dv + col] + f(k[kj + r] * m[col]));
      }
      const o = coreo + j * c.dv; // 5. core = scale q^T S
      for (let col = 0; col < c.dv; col++) core[o + col] = 0;
      for (let r = 0; r < c.dk; r++) {
        for (let col = 0; col < c.dv; col++) core[o + col] = f(core[o + col] + f(q[qj + r] * S[r * c.dv + col]));
      }
      for (let col = 0; col < c.dv; col++) core[o + col] = f(this.scale * core[o + col]);
    }
    // 7 gated_norm: RMSNorm per head with plain w (per_head: head j's slice), then times silu(z)
    const [cg, cgo] = at('core_gated');
    const wn = w['linear_attn.norm.weight'];
    for (let j = 0; j < c.Hv; j++) {
      const o = j * c.dv;
      rmsNorm(core, coreo + o, c.dv, wn, this.normMode === 'per_head' ? o : 0, c.eps, cg, cgo + o);
      for (let col = 0; col < c.dv; col++) cg[cgo + o + col] = f(cg[cgo + o + col] * silu(z[zo + o + col]));
    }
    const [ao2, aoo] = at('attn_out'); // 8 out_proj
    matvec(w['linear_attn.out_proj.weight'], c.D, c.valueDim, cg, cgo, ao2, aoo);
    const [h, ho] = at('h'); // 9 residual
    for (let d = 0; d < c.D; d++) h[ho + d] = f(x[xi + d] + ao2[aoo + d]);
    const [hn, hno] = at('h_norm'); // 10 post_norm
    rmsNorm(h, ho, c.D, this.wPost, 0, c.eps, hn, hno);
    const [mo, moo] = at('mlp_out');
    if (c.moe) {
      this.sparseBlock(hn, hno, at, mo, moo);
    } else { // 11 mlp: down(silu(gate h_norm) * up h_norm)
      const gate = new Float32Array(c.I); const up = new Float32Array(c.I);
      matvec(w['mlp.gate_proj.weight'], c.I, c.D, hn, hno, gate, 0);
      matvec(w['mlp.up_proj.weight'], c.I, c.D, hn, hno, up, 0);
      for (let n = 0; n < c.I; n++) gate[n] = f(silu(gate[n]) * up[n]);
      matvec(w['mlp.down_proj.weight'], c.D, c.I, gate, 0, mo, moo);
    }
    const [out, outo] = at('out'); // 12 output
    for (let d = 0; d < c.D; d++) out[outo + d] = f(h[ho + d] + mo[moo + d]);
  }

  // 11 of a sparse layer (docs/moe.md): router, routing, experts, shared_expert, then mlp_out = their sum.
  sparseBlock(hn, hno, at, mo, moo) {
    const { c, w } = this;
    const [lg, lgo] = at('router_logits'); // router: l = W_router h_norm
    matvec(w['mlp.gate.weight'], c.E, c.D, hn, hno, lg, lgo);
    // routing: p = softmax(l) in float32; the top_k by p, descending, an exact tie to the LOWER expert
    // index (a strict > while scanning upwards keeps the first); weights p[sel] / sum p[sel]
    const p = new Float32Array(c.E);
    let max = -Infinity;
    for (let e = 0; e < c.E; e++) max = Math.max(max, lg[lgo + e]);
    for (let e = 0; e < c.E; e++) p[e] = f(Math.exp(f(lg[lgo + e] - max)));
    const total = treeSum(Float32Array.from(p), c.E);
    for (let e = 0; e < c.E; e++) p[e] = f(p[e] / total);
    const [rw, rwo] = at('routing_weights'); const [se, seo] = at('selected_experts');
    const taken = new Uint8Array(c.E);
    let sum = 0;
    for (let j = 0; j < c.topK; j++) {
      let best = -1;
      for (let e = 0; e < c.E; e++) if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      se[seo + j] = best;
      rw[rwo + j] = p[best];
      sum = f(sum + p[best]);
    }
    if (c.renorm) for (let j = 0; j < c.topK; j++) rw[rwo + j] = f(rw[rwo + j] / sum);
    // experts: sum_j w_j down_e(silu(gate_e h) * up_e h), e = selected[j], in slot order
    const [eo, eoo] = at('experts_out');
    const act = new Float32Array(Math.max(c.Im, c.Is)); const upv = new Float32Array(Math.max(c.Im, c.Is));
    const y = new Float32Array(c.D);
    eo.fill(0, eoo, eoo + c.D);
    const gu = w['mlp.experts.gate_up_proj']; const dn = w['mlp.experts.down_proj'];
    for (let j = 0; j < c.topK; j++) {
      const e = se[seo + j];
      const base = e * 2 * c.Im * c.D; // expert e's rows: gate (Im) then up (Im), each of D
      for (let n = 0; n < c.Im; n++) {
        act[n] = dot(gu, base + n * c.D, hn, hno, c.D);
        upv[n] = dot(gu, base + (c.Im + n) * c.D, hn, hno, c.D);
        act[n] = f(silu(act[n]) * upv[n]);
      }
      matvec(dn.subarray(e * c.D * c.Im, (e + 1) * c.D * c.Im), c.D, c.Im, act, 0, y, 0);
      for (let d = 0; d < c.D; d++) eo[eoo + d] = f(eo[eoo + d] + f(rw[rwo + j] * y[d]));
    }
    // shared_expert: sigmoid(w_sg h_norm) * down_s(silu(gate_s h) * up_s h)
    const [so, soo] = at('shared_out');
    matvec(w['mlp.shared_expert.gate_proj.weight'], c.Is, c.D, hn, hno, act, 0);
    matvec(w['mlp.shared_expert.up_proj.weight'], c.Is, c.D, hn, hno, upv, 0);
    for (let n = 0; n < c.Is; n++) act[n] = f(silu(act[n]) * upv[n]);
    matvec(w['mlp.shared_expert.down_proj.weight'], c.D, c.Is, act, 0, so, soo);
    const sg = sigmoid(dot(w['mlp.shared_expert_gate.weight'], 0, hn, hno, c.D));
    for (let d = 0; d < c.D; d++) so[soo + d] = f(sg * so[soo + d]);
    for (let d = 0; d < c.D; d++) mo[moo + d] = f(eo[eoo + d] + so[soo + d]); // mlp: moe_sum
  }
}
