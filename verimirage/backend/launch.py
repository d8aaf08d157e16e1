"""A program-wide C launcher for the lean path: all of a call's kernel launches in one C call.

The lean path of :class:`verimirage.backend.runtime.CompiledProgram` resolves, once per input signature, every
launch of a compiled program: the kernel (a loaded CUDA function), its grid, block and shared memory, and its
parameters, of which only the data pointers change between calls. Triton's own launcher takes every argument
again on each launch (one Python call per kernel with 20-40 arguments, parsed one by one). This module's launcher
takes them once: :func:`make_plan` packs each kernel's parameter template (integers fixed, pointer slots marked
with the index of the pointer that fills them and a byte offset) into a C structure, and per call
``launch(plan, stream, *pointers)`` copies the templates onto the C stack, writes the call's pointers into their
slots and calls ``cuLaunchKernel`` for each kernel, with the GIL released.

The parameter layout is not trusted from Triton's signature alone: :func:`make_plan` asks the driver for each
kernel's parameters (``cuFuncGetParamInfo``: count and byte size of each) and refuses a plan whose layout
differs from the one it derived (the caller then keeps Triton's launcher). Only kernels Triton launches with a
plain ``cuLaunchKernel`` qualify: one CTA per cluster, no programmatic dependent launch, no cooperative grid,
no scratch buffers, integer and pointer parameters.

The extension is compiled once per machine with Triton's own helper (the C compiler Triton needs for its
launchers) and cached by Triton; nothing is linked at build time (``libcuda.so.1`` is opened at run time).
``VERIMIRAGE_LAUNCHER=triton`` in the environment (read when a plan is made) keeps Triton's launchers, and
``VERIMIRAGE_TENSOR_GUARD=0`` the lean path's Python signature check alone (for comparison, or should either
misbehave on another PyTorch or Triton).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

#: Triton signature types of integer parameters and their byte sizes.
INT_SIZES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u1": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8}

#: Most parameters per kernel and kernels per plan the C side holds on its stack.
MAX_PARAMS = 128
MAX_KERNELS = 64

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#define MAX_PARAMS @MAX_PARAMS@
#define MAX_KERNELS @MAX_KERNELS@

typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);
typedef int (*ctx_get_t)(void**);
typedef int (*ctx_set_t)(void*);
typedef int (*dev_get_t)(int*, int);
typedef int (*retain_t)(void**, int);
typedef int (*param_info_t)(void*, size_t, size_t*, size_t*);
typedef int (*err_name_t)(int, const char**);

static launch_t cu_launch = NULL;
static ctx_get_t cu_ctx_get = NULL;
static ctx_set_t cu_ctx_set = NULL;
static dev_get_t cu_dev_get = NULL;
static retain_t cu_retain = NULL;
static param_info_t cu_param_info = NULL;
static err_name_t cu_err_name = NULL;

/* a slot: parameter `param` gets pointer number `src` of the call plus `offset` bytes */
typedef struct { int param; int src; uint64_t offset; } slot_t;

typedef struct {
  void* function;
  unsigned grid[3];
  unsigned block;
  unsigned shared;
  int nparams;
  uint64_t values[MAX_PARAMS];
  int nslots;
  slot_t slots[MAX_PARAMS];
} kernel_t;

typedef struct {
  int device;
  int nsrc;
  int nkernels;
  kernel_t kernels[1];
} plan_t;

static int load_driver(void) {
  if (cu_launch) return 0;
  void* h = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!h) { PyErr_SetString(PyExc_RuntimeError, "cannot open libcuda.so.1"); return -1; }
  cu_ctx_get = (ctx_get_t)dlsym(h, "cuCtxGetCurrent");
  cu_ctx_set = (ctx_set_t)dlsym(h, "cuCtxSetCurrent");
  cu_dev_get = (dev_get_t)dlsym(h, "cuDeviceGet");
  cu_retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
  cu_param_info = (param_info_t)dlsym(h, "cuFuncGetParamInfo");
  cu_err_name = (err_name_t)dlsym(h, "cuGetErrorName");
  launch_t l = (launch_t)dlsym(h, "cuLaunchKernel");
  if (!l || !cu_ctx_get || !cu_ctx_set || !cu_dev_get || !cu_retain) {
    PyErr_SetString(PyExc_RuntimeError, "libcuda.so.1 lacks cuLaunchKernel or the context functions");
    return -1;
  }
  cu_launch = l;
  return 0;
}

static void cuda_error(const char* what, int code) {
  const char* name = NULL;
  if (cu_err_name) cu_err_name(code, &name);
  PyErr_Format(PyExc_RuntimeError, "%s failed: CUDA error %d (%s)", what, code, name ? name : "unknown");
}

static void free_plan(PyObject* cap) { PyMem_Free(PyCapsule_GetPointer(cap, "vm_plan")); }

static int as_u64(PyObject* o, uint64_t* out) {
  unsigned long long v = PyLong_AsUnsignedLongLongMask(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
  *out = (uint64_t)v;
  return 0;
}

/* make(device, nsrc, kernels, check) -> capsule
   kernels: sequence of (function, gx, gy, gz, block, shared, values, slots, sizes)
   values: the parameter values (pointer slots hold 0); slots: (param, src, offset) triples;
   sizes: the byte size of each parameter, checked against the driver's when check is true */
static PyObject* make(PyObject* self, PyObject* args) {
  int device, nsrc, check;
  PyObject* kernels;
  if (!PyArg_ParseTuple(args, "iiOp", &device, &nsrc, &kernels, &check)) return NULL;
  if (check && load_driver()) return NULL;
  if (nsrc < 0 || nsrc > MAX_PARAMS) {
    PyErr_Format(PyExc_ValueError, "make: %d pointers; at most %d", nsrc, MAX_PARAMS);
    return NULL;
  }
  PyObject* seq = PySequence_Fast(kernels, "kernels: a sequence");
  if (!seq) return NULL;
  Py_ssize_t nk = PySequence_Fast_GET_SIZE(seq);
  if (nk < 1 || nk > MAX_KERNELS) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "make: %zd kernels; 1 to %d supported", nk, MAX_KERNELS);
    return NULL;
  }
  plan_t* plan = (plan_t*)PyMem_Calloc(1, sizeof(plan_t) + (size_t)(nk - 1) * sizeof(kernel_t));
  if (!plan) { Py_DECREF(seq); return PyErr_NoMemory(); }
  plan->device = device;
  plan->nsrc = nsrc;
  plan->nkernels = (int)nk;
  for (Py_ssize_t k = 0; k < nk; k++) {
    kernel_t* K = &plan->kernels[k];
    PyObject *fn, *values, *slots, *sizes;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "OIIIIIOOO", &fn, &K->grid[0], &K->grid[1],
                          &K->grid[2], &K->block, &K->shared, &values, &slots, &sizes))
      goto fail;
    uint64_t f;
    if (as_u64(fn, &f)) goto fail;
    K->function = (void*)(uintptr_t)f;
    Py_ssize_t np = PySequence_Size(values);
    if (np < 0) goto fail;
    if (np > MAX_PARAMS || PySequence_Size(sizes) != np) {
      PyErr_Format(PyExc_ValueError, "make: kernel %zd: %zd parameters (sizes for %zd); at most %d", k, np,
                   PySequence_Size(sizes), MAX_PARAMS);
      goto fail;
    }
    K->nparams = (int)np;
    for (Py_ssize_t i = 0; i < np; i++) {
      PyObject* v = PySequence_GetItem(values, i);
      int bad = !v || as_u64(v, &K->values[i]);
      Py_XDECREF(v);
      if (bad) goto fail;
    }
    Py_ssize_t ns = PySequence_Size(slots);
    if (ns < 0) goto fail;
    if (ns > np) { PyErr_SetString(PyExc_ValueError, "make: more pointer slots than parameters"); goto fail; }
    K->nslots = (int)ns;
    for (Py_ssize_t i = 0; i < ns; i++) {
      PyObject* s = PySequence_GetItem(slots, i);
      if (!s) goto fail;
      unsigned long long off;
      int ok = PyArg_ParseTuple(s, "iiK", &K->slots[i].param, &K->slots[i].src, &off);
      Py_DECREF(s);
      if (!ok) goto fail;
      K->slots[i].offset = (uint64_t)off;
      if (K->slots[i].param < 0 || K->slots[i].param >= np || K->slots[i].src < 0 || K->slots[i].src >= nsrc) {
        PyErr_Format(PyExc_ValueError, "make: kernel %zd: slot %zd out of range", k, i);
        goto fail;
      }
    }
    if (check) { /* the driver's parameter layout must be the one derived from the signature */
      if (!cu_param_info) { PyErr_SetString(PyExc_RuntimeError, "no cuFuncGetParamInfo in this driver"); goto fail; }
      for (Py_ssize_t i = 0; i <= np; i++) {
        size_t off = 0, size = 0;
        int r = cu_param_info(K->function, (size_t)i, &off, &size);
        if (i == np) {
          if (r == 0) { PyErr_Format(PyExc_ValueError, "make: kernel %zd has more than %zd parameters", k, np);
                        goto fail; }
          break;
        }
        if (r) { cuda_error("cuFuncGetParamInfo", r); goto fail; }
        PyObject* want = PySequence_GetItem(sizes, i);
        if (!want) goto fail;
        size_t w = PyLong_AsSize_t(want);
        Py_DECREF(want);
        if (w == (size_t)-1 && PyErr_Occurred()) goto fail;
        if (w != size) {
          PyErr_Format(PyExc_ValueError, "make: kernel %zd parameter %zd: %zu bytes, expected %zu", k, i, size, w);
          goto fail;
        }
      }
    }
  }
  Py_DECREF(seq);
  PyObject* cap = PyCapsule_New(plan, "vm_plan", free_plan);
  if (!cap) PyMem_Free(plan);
  return cap;
fail:
  Py_DECREF(seq);
  PyMem_Free(plan);
  return NULL;
}

/* fill kernel K's parameters for the call's pointers src into v (values) and p (pointers to them) */
static inline void fill(const kernel_t* K, const uint64_t* src, uint64_t* v, void** p) {
  memcpy(v, K->values, (size_t)K->nparams * sizeof(uint64_t));
  for (int i = 0; i < K->nslots; i++) v[K->slots[i].param] = src[K->slots[i].src] + K->slots[i].offset;
  for (int i = 0; i < K->nparams; i++) p[i] = &v[i];
}

static int read_call(PyObject* const* args, Py_ssize_t n, plan_t** plan, uint64_t* stream, uint64_t* src) {
  if (n < 2) { PyErr_SetString(PyExc_TypeError, "launch(plan, stream, *pointers)"); return -1; }
  *plan = (plan_t*)PyCapsule_GetPointer(args[0], "vm_plan");
  if (!*plan) return -1;
  if (n - 2 != (*plan)->nsrc) {
    PyErr_Format(PyExc_TypeError, "launch: %zd pointers; this plan takes %d", n - 2, (*plan)->nsrc);
    return -1;
  }
  if (as_u64(args[1], stream)) return -1;
  for (Py_ssize_t i = 2; i < n; i++)
    if (as_u64(args[i], &src[i - 2])) return -1;
  return 0;
}

/* launch(plan, stream, *pointers): every kernel of the plan, in order, on the stream */
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  plan_t* plan;
  uint64_t stream, src[MAX_PARAMS];
  if (n - 2 > MAX_PARAMS) { PyErr_SetString(PyExc_TypeError, "launch: too many pointers"); return NULL; }
  if (read_call(args, n, &plan, &stream, src)) return NULL;
  if (!cu_launch && load_driver()) return NULL;
  uint64_t v[MAX_PARAMS];
  void* p[MAX_PARAMS];
  int r = 0, k = 0;
  void* ctx = NULL;
  Py_BEGIN_ALLOW_THREADS;
  if (cu_ctx_get(&ctx) == 0 && !ctx) { /* a thread without a current context: the device's primary one */
    int dev;
    if (cu_dev_get(&dev, plan->device) == 0 && cu_retain(&ctx, dev) == 0) cu_ctx_set(ctx);
  }
  for (k = 0; k < plan->nkernels; k++) {
    const kernel_t* K = &plan->kernels[k];
    fill(K, src, v, p);
    r = cu_launch(K->function, K->grid[0], K->grid[1], K->grid[2], K->block, 1, 1, K->shared,
                  (void*)(uintptr_t)stream, p, NULL);
    if (r) break;
  }
  Py_END_ALLOW_THREADS;
  if (r) {
    char what[64];
    snprintf(what, sizeof what, "cuLaunchKernel (kernel %d of the plan)", k);
    cuda_error(what, r);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* params(plan, stream, *pointers) -> [[parameter values of each kernel]]: what launch would pass (tests) */
static PyObject* params(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  plan_t* plan;
  uint64_t stream, src[MAX_PARAMS];
  if (n - 2 > MAX_PARAMS) { PyErr_SetString(PyExc_TypeError, "params: too many pointers"); return NULL; }
  if (read_call(args, n, &plan, &stream, src)) return NULL;
  PyObject* out = PyList_New(plan->nkernels);
  if (!out) return NULL;
  uint64_t v[MAX_PARAMS];
  void* p[MAX_PARAMS];
  for (int k = 0; k < plan->nkernels; k++) {
    const kernel_t* K = &plan->kernels[k];
    fill(K, src, v, p);
    PyObject* row = PyList_New(K->nparams);
    if (!row) { Py_DECREF(out); return NULL; }
    for (int i = 0; i < K->nparams; i++) {
      PyObject* x = PyLong_FromUnsignedLongLong(*(uint64_t*)p[i]);
      if (!x) { Py_DECREF(row); Py_DECREF(out); return NULL; }
      PyList_SET_ITEM(row, i, x);
    }
    PyList_SET_ITEM(out, k, row);
  }
  return out;
}

static PyMethodDef methods[] = {
  {"make", make, METH_VARARGS, "make(device, nsrc, kernels, check) -> plan"},
  {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(plan, stream, *pointers)"},
  {"params", (PyCFunction)(void (*)(void))params, METH_FASTCALL, "params(plan, stream, *pointers) -> values"},
  {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "vm_lean_launch", NULL, -1, methods};
PyMODINIT_FUNC PyInit_vm_lean_launch(void) { return PyModule_Create(&mod); }
""".replace("@MAX_PARAMS@", str(MAX_PARAMS)).replace("@MAX_KERNELS@", str(MAX_KERNELS))

_LOCK = threading.Lock()
_MODULE: list[Any] = []  # [module] once built; [None] if it cannot be built here


def module() -> Any:
    """The compiled extension (built once per machine, cached by Triton), or ``None`` where it cannot be built."""
    with _LOCK:
        if not _MODULE:
            try:
                from triton.runtime.build import compile_module_from_src

                _MODULE.append(compile_module_from_src(_SOURCE, "vm_lean_launch", libraries=["dl"]))
            except Exception as e:  # no C compiler or Python headers: Triton's launchers stay in use
                log.info("no program-wide C launcher (%s: %s); using Triton's launchers", type(e).__name__, e)
                _MODULE.append(None)
        return _MODULE[0]


def kernel_entry(kern: Any, call: Sequence[Any], grid: tuple[int, int, int],
                 pointer_source: Sequence[tuple[int, int] | None]) -> tuple[Any, ...]:
    """One kernel's entry for :func:`make_plan` from a compiled Triton kernel and the arguments it was launched with.

    ``call`` is the argument list given to ``JITFunction.run`` (tensors and integers, in the kernel's parameter
    order); ``pointer_source[i]`` is, for a tensor argument ``i``, the ``(pointer index, byte offset)`` of the
    launch pointer that replaces it on later calls (``None`` for integer arguments). Raises ``ValueError`` for a
    kernel this launcher does not serve (Triton's launcher is used for it then).
    """
    launcher = kern.run
    meta = kern.metadata
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        raise ValueError("the kernel needs scratch buffers")
    if getattr(launcher, "launch_cooperative_grid", True) or getattr(launcher, "launch_pdl", True):
        raise ValueError("cooperative or programmatic-dependent launch")
    num_warps, num_ctas, shared = kern.packed_metadata
    if num_ctas != 1 or getattr(meta, "num_ctas", 1) != 1:
        raise ValueError(f"{num_ctas} CTAs per cluster")
    if getattr(meta, "tensordesc_meta", None):
        raise ValueError("tensor descriptor arguments")
    sig = list(kern.src.signature.values())
    if len(sig) != len(call):
        raise ValueError(f"{len(sig)} signature entries for {len(call)} arguments")
    values: list[int] = []
    sizes: list[int] = []
    slots: list[tuple[int, int, int]] = []
    for ty, arg, src in zip(sig, call, pointer_source, strict=True):
        if ty == "constexpr":  # specialised into the kernel (an integer 1, say): no parameter
            continue
        if not isinstance(ty, str):
            raise ValueError(f"argument type {ty!r}")
        if ty.startswith("*"):
            if src is None:
                raise ValueError(f"a pointer parameter ({ty}) without a source")
            slots.append((len(values), src[0], src[1]))
            values.append(0)
            sizes.append(8)
        elif ty in INT_SIZES and isinstance(arg, int) and src is None:
            values.append(arg & 0xFFFFFFFFFFFFFFFF)
            sizes.append(INT_SIZES[ty])
        else:
            raise ValueError(f"argument type {ty!r}")
    values += [0, 0]  # Triton's global and profile scratch pointers (null: no scratch)
    sizes += [8, 8]
    return (kern.function, grid[0] * num_ctas, grid[1], grid[2], 32 * num_warps, shared, values, slots, sizes)


def make_plan(device: int, nsrc: int, entries: Sequence[tuple[Any, ...]], check: bool = True) -> Any:
    """A plan (a capsule) for ``launch(plan, stream, *pointers)`` with ``nsrc`` pointers; ``check``: compare each
    kernel's parameter layout with the driver's (``cuFuncGetParamInfo``). Raises if the layouts differ."""
    mod = module()
    if mod is None:
        raise RuntimeError("the C launcher could not be built on this machine")
    return mod.make(device, nsrc, list(entries), check)
