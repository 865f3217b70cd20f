// A WebGPU provider for Node on a CPU-only machine, installed as navigator.gpu for doppler's own
// device initialisation (doppler-gpu's initDevice()).
//
//   doe   doe-gpu 0.4.7 (Vulkan; lavapipe here). Its four defects are worked around in the glue, not
//         in doppler's WGSL (applyDoeWorkarounds below):
//           1. a workgroup array sized by an `override` constant is rejected (sema: InvalidType):
//              at createComputePipeline, each `override NAME: T = v;` given in `compute.constants`
//              is substituted as `const NAME: T = <value>;` and the shader module recompiled;
//           2. a compute pass begun with a `label` silently does nothing: beginComputePass drops it;
//           3. reads after a separate submit can be stale: every queue.submit records
//              onSubmittedWorkDone(), and every mapAsync waits for it (run.js also awaits the queue
//              after each kernel call);
//           4. of two compute passes in one command buffer the second is sometimes not run, with no
//              error and nothing on stderr (doppler's conv + recurrent submit: the conv ran, the
//              recurrent state came back equal to its input and the output buffer untouched, in
//              call 0 row 0 of prefill-decode and call 1 of chunked; Dawn runs both): each compute
//              pass is recorded into a command encoder of its own (splitPasses), and queue.submit
//              submits them one by one, in order.
//         doe-gpu 0.4.7's prebuilt native library is compiled for AVX-512 (zmm stores in its Vulkan
//         feature probe): on a CPU without AVX-512 it dies with SIGILL at requestAdapter. It is
//         probed in a child process first, so that a crash is a reason, not a dead runner.
//   dawn  Google's Dawn for Node (`webgpu`, doppler-gpu's own optional dependency) over lavapipe,
//         through a 60-line Vulkan layer (vkshim/) that reports lavapipe's two missing
//         image-array dynamic-indexing features, without which Dawn refuses the device; the layer
//         strips them again from vkCreateDevice. Compute over buffers (all this kernel uses) never
//         touches them. Built with cc on first use (needs libvulkan-dev headers).

import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const BUILD = join(HERE, 'build');

export function cpuHasAvx512() {
  try { return /\bavx512f\b/.test(readFileSync('/proc/cpuinfo', 'utf8')); } catch { return null; }
}

// ---- doe-gpu and its workarounds -----------------------------------------------------------------

export function substituteOverrides(code, constants) {
  let out = code;
  const left = {};
  for (const [name, value] of Object.entries(constants || {})) {
    const re = new RegExp(`override\\s+${name}\\s*:\\s*(\\w+)\\s*(=[^;]*)?;`);
    const m = out.match(re);
    if (!m) { left[name] = value; continue; }
    const type = m[1];
    const literal = type === 'u32' ? `${value >>> 0}u` : type === 'i32' ? `${value | 0}i` : type === 'bool' ? String(!!value) : `${Number(value)}`;
    out = out.replace(re, `const ${name}: ${type} = ${literal};`);
  }
  return { code: out, constants: left };
}

// Workarounds 2 and 4: a command encoder that begins a fresh real encoder (from `make`) for each
// compute pass after the first command, and drops pass labels; finish() returns the real command
// buffers under PARTS, which the wrapped queue.submit submits one by one. Every other method goes to
// the current real encoder.
export const PARTS = Symbol('gdncheck.doeCommandBufferParts');

export function splitPasses(make) {
  const parts = [make()];
  let used = false;
  const current = () => parts[parts.length - 1];
  return new Proxy({}, {
    get(_target, prop) {
      if (prop === 'beginComputePass') {
        return (d = {}) => {
          if (used) parts.push(make());
          used = true;
          const { label, ...rest } = d;
          return current().beginComputePass(rest);
        };
      }
      if (prop === 'finish') return () => ({ [PARTS]: parts.map((enc) => enc.finish()) });
      const enc = current();
      const v = Reflect.get(enc, prop, enc);
      if (typeof v !== 'function') return v;
      return (...args) => { used = true; return v.apply(enc, args); };
    },
  });
}

export function applyDoeWorkarounds(device) {
  const sources = new WeakMap();
  const createShaderModule = device.createShaderModule.bind(device);
  device.createShaderModule = (desc) => {
    const mod = createShaderModule(desc);
    sources.set(mod, desc);
    return mod;
  };
  const rewrite = (desc) => {
    const src = sources.get(desc?.compute?.module);
    if (!src || !desc.compute.constants) return desc;
    const { code, constants } = substituteOverrides(src.code, desc.compute.constants);
    const module = createShaderModule({ ...src, code });
    const compute = { ...desc.compute, module };
    if (Object.keys(constants).length) compute.constants = constants; else delete compute.constants;
    return { ...desc, compute };
  };
  const createComputePipeline = device.createComputePipeline.bind(device);
  device.createComputePipeline = (desc) => createComputePipeline(rewrite(desc));
  if (device.createComputePipelineAsync) {
    const createAsync = device.createComputePipelineAsync.bind(device);
    device.createComputePipelineAsync = (desc) => createAsync(rewrite(desc));
  }
  const createCommandEncoder = device.createCommandEncoder.bind(device);
  device.createCommandEncoder = (desc) => splitPasses(() => createCommandEncoder(desc));
  const queue = device.queue;
  let pending = Promise.resolve();
  const submit = queue.submit.bind(queue);
  queue.submit = (buffers) => {
    for (const buf of buffers) for (const part of buf?.[PARTS] ?? [buf]) submit([part]);
    pending = queue.onSubmittedWorkDone();
  };
  const createBuffer = device.createBuffer.bind(device);
  device.createBuffer = (desc) => {
    const buf = createBuffer(desc);
    const mapAsync = buf.mapAsync.bind(buf);
    buf.mapAsync = async (...args) => { await pending; return mapAsync(...args); };
    return buf;
  };
  return device;
}

// Diagnostic only (GDN_DOPPLER_PATCH=barrier; never the judged default): the one-line fix of the
// race the issue is about. In linear_attention_recurrent every thread reads the reduction result
// shared_sq[0] and then, with no barrier, writes its next partial into shared_sq[lid]: thread 0's
// write can land before threads of another subgroup have read shared_sq[0]. The patch inserts a
// workgroupBarrier() after each such read, nothing else.
export function barrierPatch(code) {
  if (!code.includes('var<workgroup> shared_sq')) return code;
  return code
    .replace(/(let q_norm_scale = [^;]*shared_sq\[0\][^;]*;)/, '$1\n    workgroupBarrier();')
    .replace(/(let k_norm_scale = [^;]*shared_sq\[0\][^;]*;)/, '$1\n    workgroupBarrier();')
    .replace(/(let inv_rms = [^;]*shared_sq\[0\][^;]*;)/, '$1\n    workgroupBarrier();');
}

export function applyDiagnosticPatch(device) {
  const createShaderModule = device.createShaderModule.bind(device);
  device.createShaderModule = (desc) => createShaderModule({ ...desc, code: barrierPatch(desc.code) });
  return device;
}

// The adapter probe in a child process: { ok, detail }.
export function probeDoe() {
  const r = spawnSync(process.execPath, [join(HERE, 'provider.js'), '--probe-doe'], { encoding: 'utf8', timeout: 60000 });
  if (r.signal) {
    const avx = cpuHasAvx512();
    return { ok: false, detail: `doe-gpu 0.4.7 died with ${r.signal} probing its adapter${r.signal === 'SIGILL' && avx === false ? ' (its prebuilt libwebgpu_doe.so uses AVX-512 instructions; this CPU has no avx512f)' : ''}` };
  }
  try { return JSON.parse(r.stdout.trim().split('\n').pop()); } catch { return { ok: false, detail: `doe-gpu probe exited ${r.status}: ${(r.stderr || '').slice(-300)}` }; }
}

async function doeGpu() {
  const doe = await import('doe-gpu');
  return doe.setupGlobals({}); // a package-local GPU; globals installed below
}

// ---- Dawn through the lavapipe shim ----------------------------------------------------------------

export function ensureShim() {
  const lib = join(BUILD, 'libgdncheck_vkshim.so');
  const manifest = join(BUILD, 'gdncheck_vkshim.json');
  if (!existsSync(lib)) {
    mkdirSync(BUILD, { recursive: true });
    execFileSync('cc', ['-O2', '-shared', '-fPIC', '-fvisibility=hidden', '-o', lib, join(HERE, 'vkshim', 'gdncheck_vkshim.c')], { stdio: 'inherit' });
  }
  const text = readFileSync(join(HERE, 'vkshim', 'gdncheck_vkshim.json.in'), 'utf8').replace('@LIB@', lib);
  writeFileSync(manifest, text);
  return BUILD;
}

async function dawnGpu() {
  process.env.VK_LAYER_PATH = ensureShim();
  process.env.VK_INSTANCE_LAYERS = 'VK_LAYER_GDNCHECK_lavapipe_shim';
  if (!process.env.XDG_RUNTIME_DIR) process.env.XDG_RUNTIME_DIR = '/tmp';
  const { create, globals } = await import('webgpu');
  Object.assign(globalThis, globals);
  return create([]);
}

// Install navigator.gpu (wrapping requestDevice so that the doe workarounds reach doppler's device).
export async function installProvider(name) {
  let gpu;
  let workarounds = false;
  if (name === 'doe') { gpu = await doeGpu(); workarounds = true; } else if (name === 'dawn') gpu = await dawnGpu();
  else throw new Error(`unknown provider ${name} (doe | dawn)`);
  if (name === 'doe') {
    const doe = await import('doe-gpu');
    // setupGlobals({}) installs its globals into the object it is given, not globalThis: the WebGPU
    // constants doppler reads (GPUShaderStage, ...) come from the package's `globals`
    for (const k of ['GPUBufferUsage', 'GPUShaderStage', 'GPUMapMode', 'GPUTextureUsage', 'GPUBuffer']) {
      const v = doe[k] ?? doe.globals?.[k] ?? doe.default?.globals?.[k];
      if (globalThis[k] === undefined && v !== undefined) globalThis[k] = v;
    }
  }
  const wrapped = {
    requestAdapter: async (opts) => {
      const adapter = await gpu.requestAdapter(opts);
      if (!adapter) return null;
      return new Proxy(adapter, {
        get(target, prop) {
          if (prop === 'requestDevice') {
            return async (desc) => {
              let device = await target.requestDevice(desc);
              if (process.env.GDN_DOPPLER_PATCH === 'barrier') device = applyDiagnosticPatch(device);
              return workarounds ? applyDoeWorkarounds(device) : device;
            };
          }
          const v = Reflect.get(target, prop, target);
          return typeof v === 'function' ? v.bind(target) : v;
        },
      });
    },
    getPreferredCanvasFormat: () => 'rgba8unorm',
    wgslLanguageFeatures: gpu.wgslLanguageFeatures ?? new Set(),
  };
  Object.defineProperty(globalThis, 'navigator', { value: { gpu: wrapped }, writable: true, configurable: true });
  return { name, workarounds };
}

if (process.argv[2] === '--probe-doe') {
  try {
    const gpu = await doeGpu();
    const adapter = await gpu.requestAdapter();
    if (!adapter) throw new Error('found no adapter');
    const features = [...adapter.features]; // doppler's initDevice reads them (0.4.7 dies here without AVX-512)
    const device = await adapter.requestDevice();
    console.log(JSON.stringify({ ok: !!device, detail: `doe-gpu adapter and device (${features.join(', ')})` }));
  } catch (e) {
    console.log(JSON.stringify({ ok: false, detail: `doe-gpu: ${e.message}` }));
  }
  process.exit(0);
}
