/* The common case of the one-stream calls in C: the Python side of TanhCellForward and FactoredTanhTrace (checks,
 * the new tensors, the call of the C kernel) written with the CPython API, so that a step at one stream costs about
 * what its arithmetic and its allocations cost, not what Python's bytecode around them costs.
 *
 * Each object here stands beside one Python object (TanhCellForward, FactoredTanhTrace), which arms it with what it
 * checked (the parameters, their addresses and dtype, the kernel, the setup) and tells it what it made (the state
 * tensors of its last call). A call here handles only that case, every check of the Python path done again or implied
 * by what was armed; anything else returns None and the Python path runs (and arms again). It never raises for a
 * case it does not handle: it raises only what a check it calls raised.
 *
 * The checks: the switch and the library (the caller module's `load(name)` is the armed library), nothing tracing
 * (torch.compiler.is_compiling, a dispatch mode, a functorch level, the JIT tracer, fx's symbolic tracing, any torch
 * function mode: the Python path then decides), no autocast, and every tensor read a plain CPU tensor with storage,
 * not negated, not functional, of the armed dtype, C-contiguous, of the armed sizes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* -- configured once (configure()) ------------------------------------------------------------------------------ */
static PyObject *tensor_type, *parameter_type;                            /* torch.Tensor, torch.nn.Parameter */
static PyObject *is_compiling, *dispatch_modes, *functorch_level, *jit_tracing, *function_modes, *fx_tracing;
static PyObject *fx_state; /* fx's thread-local flag holder (its __dict__'s "flag"), or None: then fx_tracing() */
static PyObject *native_load, *native_globals, *environment_enabled; /* lightning_ortho._native's load, its globals */
static PyObject *has_storage, *is_functional, *autocast;
static PyObject *module_globals, *grad_enabled; /* torch.nn.modules.module's globals (the global hooks), is_grad_enabled */
static PyObject *s_data_ptr, *s_is_cpu, *s_is_neg, *s_is_contiguous, *s_new_empty, *s_dtype, *s_shape, *s_load;
static PyObject *s_parameters, *s_weight_hh, *s_weight_ih, *s_bias, *s___dict__, *s_flag, *s_switch;
static PyObject *s_forward, *s_compiled_call_impl, *s_hooks[4], *s_global_hooks[4];

/* 1 true, 0 false, -1 error */
static int truth_of_call(PyObject *function, PyObject *argument) {
    PyObject *result = argument ? PyObject_CallOneArg(function, argument) : PyObject_CallNoArgs(function);
    if (result == NULL) return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}

/* Whether a tracer, transform or mode may see the ops (guard.tracing); any function mode counts (the Python path
 * tells a torch.device block from the others). 1 yes, 0 no, -1 error. */
static int tracing(void) {
    int truth;
    if ((truth = truth_of_call(is_compiling, NULL)) != 0) return truth;
    if ((truth = truth_of_call(dispatch_modes, NULL)) != 0) return truth;
    PyObject *level = PyObject_CallNoArgs(functorch_level);
    if (level == NULL) return -1;
    truth = level != Py_None;
    Py_DECREF(level);
    if (truth) return 1;
    if ((truth = truth_of_call(jit_tracing, NULL)) != 0) return truth;
    if (fx_state != Py_None) { /* ten times cheaper than the accessor (as guard.py reads it) */
        PyObject *values = PyObject_GetAttr(fx_state, s___dict__);
        if (values == NULL) return -1;
        PyObject *flag = PyDict_Check(values) ? PyDict_GetItemWithError(values, s_flag) : NULL;
        truth = flag == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(flag);
        Py_DECREF(values);
    } else {
        truth = truth_of_call(fx_tracing, NULL);
    }
    if (truth != 0) return truth;
    return truth_of_call(function_modes, NULL);
}

/* guard.real_cpu_tensor without the tracing checks. 1 yes, 0 no, -1 error. */
static int plain_cpu_tensor(PyObject *t) {
    PyObject *type = (PyObject *)Py_TYPE(t);
    if (type != tensor_type && type != parameter_type) return 0;
    PyObject *flag = PyObject_GetAttr(t, s_is_cpu);
    if (flag == NULL) return -1;
    int yes = flag == Py_True;
    Py_DECREF(flag);
    if (!yes) return 0;
    flag = PyObject_CallMethodNoArgs(t, s_is_neg);
    if (flag == NULL) return -1;
    yes = flag == Py_False;
    Py_DECREF(flag);
    if (!yes) return 0;
    int truth = truth_of_call(has_storage, t);
    if (truth != 1) return truth;
    truth = truth_of_call(is_functional, t);
    return truth < 0 ? -1 : !truth;
}

/* t.data_ptr() into *out; 0, or -1 on error */
static int data_ptr(PyObject *t, void **out) {
    PyObject *value = PyObject_CallMethodNoArgs(t, s_data_ptr);
    if (value == NULL) return -1;
    *out = PyLong_AsVoidPtr(value);
    Py_DECREF(value);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* Whether t is of dtype, C-contiguous and of shape (rows, columns) (columns < 0: any, written to *columns_out).
 * 1 yes, 0 no, -1 error. */
static int matrix_of(PyObject *t, PyObject *dtype, long *rows, long *columns) {
    PyObject *value = PyObject_GetAttr(t, s_dtype);
    if (value == NULL) return -1;
    int yes = value == dtype; /* dtypes are singletons */
    Py_DECREF(value);
    if (!yes) return 0;
    PyObject *shape = PyObject_GetAttr(t, s_shape);
    if (shape == NULL) return -1;
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 2) {
        Py_DECREF(shape);
        return 0;
    }
    long r = PyLong_AsLong(PyTuple_GET_ITEM(shape, 0)), c = PyLong_AsLong(PyTuple_GET_ITEM(shape, 1));
    Py_DECREF(shape);
    if (PyErr_Occurred()) return -1;
    if ((*rows >= 0 && r != *rows) || (*columns >= 0 && c != *columns)) return 0;
    *rows = r;
    *columns = c;
    value = PyObject_CallMethodNoArgs(t, s_is_contiguous);
    if (value == NULL) return -1;
    yes = value == Py_True;
    Py_DECREF(value);
    return yes;
}

/* like.new_empty(sizes...) (1 to 3 sizes), a new reference or NULL */
static PyObject *new_empty(PyObject *like, int count, long a, long b, long c) {
    long sizes[3] = {a, b, c};
    PyObject *arguments[4] = {like, NULL, NULL, NULL};
    PyObject *result = NULL;
    for (int i = 0; i < count; i++) {
        arguments[i + 1] = PyLong_FromLong(sizes[i]);
        if (arguments[i + 1] == NULL) goto done;
    }
    result = PyObject_VectorcallMethod(s_new_empty, arguments, (size_t)(count + 1), NULL);
done:
    for (int i = 0; i < count; i++) Py_XDECREF(arguments[i + 1]);
    return result;
}

/* The switch of the kernels: native_kernels' setting, else LIGHTNING_ORTHO_NATIVE (lightning_ortho._native.enabled,
 * read as `load` reads it). 1 on, 0 off, -1 error. */
static int kernels_enabled(void) {
    PyObject *setting = PyDict_GetItemWithError(native_globals, s_switch); /* borrowed */
    if (setting == NULL) return PyErr_Occurred() ? -1 : 0;
    if (setting == Py_True) return 1;
    if (setting == Py_False) return 0;
    return truth_of_call(environment_enabled, NULL);
}

/* The caller module's load(name) gives `library` (with the library's own `load`, which caches what it loaded, the
 * switch alone decides: what was armed is what it gives), and nothing traces, and no autocast. 1 yes, 0 no, -1. */
static int may_run(PyObject *globals, PyObject *name, PyObject *library) {
    PyObject *load = PyDict_GetItemWithError(globals, s_load); /* borrowed; looked up at every call, as Python does */
    if (load == NULL) return PyErr_Occurred() ? -1 : 0;
    if (load == native_load) {
        int on = kernels_enabled();
        if (on != 1) return on;
    } else { /* another `load` (a test's, say): what it gives decides */
        PyObject *loaded = PyObject_CallOneArg(load, name);
        if (loaded == NULL) return -1;
        int same = loaded == library;
        Py_DECREF(loaded);
        if (!same) return 0;
    }
    int truth = tracing();
    if (truth != 0) return truth < 0 ? -1 : 0;
    truth = truth_of_call(autocast, NULL);
    return truth < 0 ? -1 : !truth;
}

/* The armed parameters are `parameters`' weight_hh, weight_ih and bias, at their addresses. 1, 0, -1. */
typedef struct {
    PyObject *weight_hh, *weight_ih, *bias; /* held */
    void *hh, *ih, *b;                      /* their data_ptr() when armed */
} armed_parameters;

static int same_parameters(const armed_parameters *armed, PyObject *parameters) {
    if (!PyDict_Check(parameters)) return 0;
    PyObject *w_hh = PyDict_GetItemWithError(parameters, s_weight_hh);
    PyObject *w_ih = w_hh ? PyDict_GetItemWithError(parameters, s_weight_ih) : NULL;
    PyObject *bias = w_ih ? PyDict_GetItemWithError(parameters, s_bias) : NULL;
    if (bias == NULL) return PyErr_Occurred() ? -1 : 0;
    if (w_hh != armed->weight_hh || w_ih != armed->weight_ih || bias != armed->bias) return 0;
    void *hh, *ih, *b;
    if (data_ptr(w_hh, &hh) || data_ptr(w_ih, &ih) || data_ptr(bias, &b)) return -1;
    return hh == armed->hh && ih == armed->ih && b == armed->b;
}

static int arm_parameters(armed_parameters *armed, PyObject *w_hh, PyObject *w_ih, PyObject *bias) {
    void *hh, *ih, *b;
    if (data_ptr(w_hh, &hh) || data_ptr(w_ih, &ih) || data_ptr(bias, &b)) return -1;
    Py_INCREF(w_hh);
    Py_INCREF(w_ih);
    Py_INCREF(bias);
    Py_XSETREF(armed->weight_hh, w_hh);
    Py_XSETREF(armed->weight_ih, w_ih);
    Py_XSETREF(armed->bias, bias);
    armed->hh = hh;
    armed->ih = ih;
    armed->b = b;
    return 0;
}

/* == TanhForward: TanhCellForward's call ========================================================================= */
typedef void (*forward_kernel)(const void *setup, const void *x, const void *h, long batch, void *h_new);

typedef struct {
    PyObject_HEAD
    armed_parameters parameters;
    PyObject *dtype, *library, *globals, *name, *keep; /* held; keep: what owns the setup's memory */
    forward_kernel kernel;
    const void *setup;
    long hidden, inputs;
    PyObject *made; /* h' of the last call (held), at made_pointer, made_batch rows */
    void *made_pointer;
    long made_batch;
} TanhForward;

static void clear_made(PyObject **made) { Py_CLEAR(*made); }

static int TanhForward_traverse(TanhForward *self, visitproc visit, void *arg) {
    Py_VISIT(self->parameters.weight_hh);
    Py_VISIT(self->parameters.weight_ih);
    Py_VISIT(self->parameters.bias);
    Py_VISIT(self->dtype);
    Py_VISIT(self->library);
    Py_VISIT(self->globals);
    Py_VISIT(self->name);
    Py_VISIT(self->keep);
    Py_VISIT(self->made);
    return 0;
}

static int TanhForward_clear(TanhForward *self) {
    Py_CLEAR(self->parameters.weight_hh);
    Py_CLEAR(self->parameters.weight_ih);
    Py_CLEAR(self->parameters.bias);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->library);
    Py_CLEAR(self->globals);
    Py_CLEAR(self->name);
    Py_CLEAR(self->keep);
    clear_made(&self->made);
    self->kernel = NULL;
    return 0;
}

static void TanhForward_dealloc(TanhForward *self) {
    PyObject_GC_UnTrack(self);
    TanhForward_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* arm(weight_hh, weight_ih, bias, dtype, library, globals, name, kernel_address, setup_address, keep, H, I) */
static PyObject *TanhForward_arm(TanhForward *self, PyObject *args) {
    PyObject *w_hh, *w_ih, *bias, *dtype, *library, *globals, *name, *keep;
    unsigned long long kernel, setup;
    long hidden, inputs;
    if (!PyArg_ParseTuple(args, "OOOOOO!UKKOll", &w_hh, &w_ih, &bias, &dtype, &library, &PyDict_Type, &globals, &name,
                          &kernel, &setup, &keep, &hidden, &inputs))
        return NULL;
    TanhForward_clear(self);
    if (arm_parameters(&self->parameters, w_hh, w_ih, bias)) return NULL;
    Py_INCREF(dtype);
    Py_INCREF(library);
    Py_INCREF(globals);
    Py_INCREF(name);
    Py_INCREF(keep);
    self->dtype = dtype;
    self->library = library;
    self->globals = globals;
    self->name = name;
    self->keep = keep;
    self->kernel = (forward_kernel)(uintptr_t)kernel;
    self->setup = (const void *)(uintptr_t)setup;
    self->hidden = hidden;
    self->inputs = inputs;
    Py_RETURN_NONE;
}

/* made(h_new, batch): h_new is the output of a call of the Python path with these armed parameters */
static PyObject *TanhForward_made(TanhForward *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 2) return PyErr_Format(PyExc_TypeError, "made(h_new, batch) takes 2 arguments");
    void *pointer;
    long batch = PyLong_AsLong(args[1]);
    if ((batch == -1 && PyErr_Occurred()) || data_ptr(args[0], &pointer)) return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(self->made, args[0]);
    self->made_pointer = pointer;
    self->made_batch = batch;
    Py_RETURN_NONE;
}

/* forward(parameters, x, h) -> h' (B, H), or None where the Python path must run */
static PyObject *TanhForward_forward(TanhForward *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 3) return PyErr_Format(PyExc_TypeError, "forward(parameters, x, h) takes 3 arguments");
    PyObject *parameters = args[0], *x = args[1], *h = args[2];
    if (self->kernel == NULL || h != self->made) Py_RETURN_NONE;
    int yes = may_run(self->globals, self->name, self->library);
    if (yes == 1) yes = same_parameters(&self->parameters, parameters);
    if (yes == 1) yes = plain_cpu_tensor(x);
    long batch = self->made_batch, inputs = self->inputs;
    if (yes == 1) yes = matrix_of(x, self->dtype, &batch, &inputs);
    void *h_pointer = NULL, *x_pointer = NULL;
    if (yes == 1) {
        if (data_ptr(h, &h_pointer) || data_ptr(x, &x_pointer)) return NULL;
        yes = h_pointer == self->made_pointer; /* still at its memory (no resize_, set_) */
    }
    if (yes < 0) return NULL;
    /* again after the checks, which call Python (a `load` that re-armed this object, say) */
    if (!yes || self->kernel == NULL || h != self->made) Py_RETURN_NONE;
    PyObject *h_new = new_empty(h, 2, batch, self->hidden, 0);
    if (h_new == NULL) return NULL;
    void *h_new_pointer;
    if (data_ptr(h_new, &h_new_pointer)) {
        Py_DECREF(h_new);
        return NULL;
    }
    self->kernel(self->setup, x_pointer, h_pointer, batch, h_new_pointer);
    Py_INCREF(h_new);
    Py_XSETREF(self->made, h_new);
    self->made_pointer = h_new_pointer;
    return h_new;
}

/* Whether `dict`[name] is a dict (or an OrderedDict) without entries. 1, 0, -1. */
static int empty_dict_at(PyObject *dict, PyObject *name) {
    PyObject *value = PyDict_GetItemWithError(dict, name);
    if (value == NULL) return PyErr_Occurred() ? -1 : 0;
    return PyDict_Check(value) && PyDict_GET_SIZE(value) == 0;
}

/* Whether nn.Module.__call__(module, ...) would only call the class's forward with autograd off: no hook of the
 * module's or global ones, not compiled by module.compile(), no forward set on the instance, autograd off; then
 * *parameters is the module's _parameters (a new reference). 1, 0, -1. */
static int only_forward(PyObject *module, PyObject **parameters) {
    int yes = truth_of_call(grad_enabled, NULL);
    if (yes != 0) return yes < 0 ? -1 : 0;
    PyObject *dict = PyObject_GenericGetDict(module, NULL);
    if (dict == NULL) return -1;
    yes = 1;
    PyObject *value = PyDict_GetItemWithError(dict, s_forward);
    if (value != NULL || PyErr_Occurred()) yes = value != NULL ? 0 : -1;
    if (yes == 1) {
        value = PyDict_GetItemWithError(dict, s_compiled_call_impl); /* the class's None where absent */
        yes = value == NULL ? (PyErr_Occurred() ? -1 : 1) : value == Py_None;
    }
    for (int i = 0; i < 4 && yes == 1; i++) yes = empty_dict_at(dict, s_hooks[i]);
    for (int i = 0; i < 4 && yes == 1; i++) yes = empty_dict_at(module_globals, s_global_hooks[i]);
    if (yes == 1) {
        value = PyDict_GetItemWithError(dict, s_parameters);
        if (value == NULL) yes = PyErr_Occurred() ? -1 : 0;
        else {
            Py_INCREF(value);
            *parameters = value;
        }
    }
    Py_DECREF(dict);
    return yes;
}

/* call(module, args) -> h' or None: nn.Module.__call__(module, *args) of a cell whose class's forward tries
 * forward(module._parameters, x, h) first (TanhRNNCell's), where that call would only call forward; None where it
 * would do more, or where forward answers None. Saves Module.__call__'s two Python frames and forward's own. */
static PyObject *TanhForward_call(TanhForward *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 2) return PyErr_Format(PyExc_TypeError, "call(module, args) takes 2 arguments");
    PyObject *call_args = args[1];
    if (!PyTuple_Check(call_args) || PyTuple_GET_SIZE(call_args) != 2) Py_RETURN_NONE;
    if (self->kernel == NULL || PyTuple_GET_ITEM(call_args, 1) != self->made) Py_RETURN_NONE; /* the cheap test */
    PyObject *parameters = NULL;
    int yes = only_forward(args[0], &parameters);
    if (yes < 0) return NULL;
    if (!yes) Py_RETURN_NONE;
    PyObject *forward_args[3] = {parameters, PyTuple_GET_ITEM(call_args, 0), PyTuple_GET_ITEM(call_args, 1)};
    PyObject *h_new = TanhForward_forward(self, forward_args, 3);
    Py_DECREF(parameters);
    return h_new;
}

static PyMethodDef TanhForward_methods[] = {
    {"arm", (PyCFunction)TanhForward_arm, METH_VARARGS, "Arm with what the Python path checked."},
    {"made", (PyCFunction)(void (*)(void))TanhForward_made, METH_FASTCALL, "Remember an output of the Python path."},
    {"forward", (PyCFunction)(void (*)(void))TanhForward_forward, METH_FASTCALL, "The step, or None."},
    {"call", (PyCFunction)(void (*)(void))TanhForward_call, METH_FASTCALL, "The module's call, or None."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject TanhForwardType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lightning_ortho_fastcall.TanhForward",
    .tp_basicsize = sizeof(TanhForward),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)TanhForward_dealloc,
    .tp_traverse = (traverseproc)TanhForward_traverse,
    .tp_clear = (inquiry)TanhForward_clear,
    .tp_methods = TanhForward_methods,
};

/* == FactoredTrace: FactoredTanhTrace's step and gradient ========================================================= */
typedef struct {
    const void *x, *h, *trace;
    void *h_new, *trace_new;
    long batch;
} step_arguments; /* factored_step_arguments of factored_traces.c */

typedef struct {
    const void *trace, *grad_h;
    void *out_hh, *out_ih, *out_b;
    long batch;
} gradient_arguments; /* factored_gradient_arguments of factored_traces.c */

typedef double (*step_kernel)(const void *setup, const step_arguments *arguments);
typedef double (*gradient_kernel)(const void *setup, const gradient_arguments *arguments);

typedef struct {
    PyObject_HEAD
    armed_parameters parameters;
    PyObject *kind, *dtype, *library, *globals, *name, *keep; /* held */
    step_kernel rflo, snap;
    gradient_kernel gradient;
    const void *setup;
    double decay, rate;
    long hidden, inputs, columns;
    int flat;
    PyObject *made_h, *made_trace; /* held */
    void *made_h_pointer, *made_trace_pointer;
    long made_batch;
} FactoredTrace;

static int FactoredTrace_traverse(FactoredTrace *self, visitproc visit, void *arg) {
    Py_VISIT(self->parameters.weight_hh);
    Py_VISIT(self->parameters.weight_ih);
    Py_VISIT(self->parameters.bias);
    Py_VISIT(self->kind);
    Py_VISIT(self->dtype);
    Py_VISIT(self->library);
    Py_VISIT(self->globals);
    Py_VISIT(self->name);
    Py_VISIT(self->keep);
    Py_VISIT(self->made_h);
    Py_VISIT(self->made_trace);
    return 0;
}

static int FactoredTrace_clear(FactoredTrace *self) {
    Py_CLEAR(self->parameters.weight_hh);
    Py_CLEAR(self->parameters.weight_ih);
    Py_CLEAR(self->parameters.bias);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->library);
    Py_CLEAR(self->globals);
    Py_CLEAR(self->name);
    Py_CLEAR(self->keep);
    Py_CLEAR(self->made_h);
    Py_CLEAR(self->made_trace);
    self->rflo = self->snap = NULL;
    self->gradient = NULL;
    return 0;
}

static void FactoredTrace_dealloc(FactoredTrace *self) {
    PyObject_GC_UnTrack(self);
    FactoredTrace_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* arm(weight_hh, weight_ih, bias, kind, dtype, library, globals, name, rflo, snap, gradient, setup, keep, decay,
 *     rate, H, I, flat) */
static PyObject *FactoredTrace_arm(FactoredTrace *self, PyObject *args) {
    PyObject *w_hh, *w_ih, *bias, *kind, *dtype, *library, *globals, *name, *keep;
    unsigned long long rflo, snap, gradient, setup;
    double decay, rate;
    long hidden, inputs;
    int flat;
    if (!PyArg_ParseTuple(args, "OOOOOOO!UKKKKOddllp", &w_hh, &w_ih, &bias, &kind, &dtype, &library, &PyDict_Type,
                          &globals, &name, &rflo, &snap, &gradient, &setup, &keep, &decay, &rate, &hidden, &inputs,
                          &flat))
        return NULL;
    FactoredTrace_clear(self);
    if (arm_parameters(&self->parameters, w_hh, w_ih, bias)) return NULL;
    PyObject **held[] = {&self->kind, &self->dtype, &self->library, &self->globals, &self->name, &self->keep};
    PyObject *values[] = {kind, dtype, library, globals, name, keep};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(values[i]);
        *held[i] = values[i];
    }
    self->rflo = (step_kernel)(uintptr_t)rflo;
    self->snap = (step_kernel)(uintptr_t)snap;
    self->gradient = (gradient_kernel)(uintptr_t)gradient;
    self->setup = (const void *)(uintptr_t)setup;
    self->decay = decay;
    self->rate = rate;
    self->hidden = hidden;
    self->inputs = inputs;
    self->columns = hidden + inputs + 1;
    self->flat = flat;
    Py_RETURN_NONE;
}

/* made(h_new, trace_new, batch): the state tensors of a step of the Python path with these armed parameters */
static PyObject *FactoredTrace_made(FactoredTrace *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 3) return PyErr_Format(PyExc_TypeError, "made(h_new, trace_new, batch) takes 3 arguments");
    void *h_pointer, *trace_pointer;
    long batch = PyLong_AsLong(args[2]);
    if ((batch == -1 && PyErr_Occurred()) || data_ptr(args[0], &h_pointer) || data_ptr(args[1], &trace_pointer))
        return NULL;
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(self->made_h, args[0]);
    Py_XSETREF(self->made_trace, args[1]);
    self->made_h_pointer = h_pointer;
    self->made_trace_pointer = trace_pointer;
    self->made_batch = batch;
    Py_RETURN_NONE;
}

/* Whether h and trace are the armed object's last state, still at their memory. 1, 0, -1. */
static int made_state(FactoredTrace *self, PyObject *h, PyObject *trace, void **h_pointer, void **trace_pointer) {
    if (self->gradient == NULL || h != self->made_h || trace != self->made_trace) return 0;
    if (data_ptr(h, h_pointer) || data_ptr(trace, trace_pointer)) return -1;
    return *h_pointer == self->made_h_pointer && *trace_pointer == self->made_trace_pointer;
}

/* step(cell, x, h, trace, snap, decay, rate) -> (h', trace', sum) or None */
static PyObject *FactoredTrace_step(FactoredTrace *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 7) return PyErr_Format(PyExc_TypeError, "step(cell, x, h, trace, snap, decay, rate) takes 7 arguments");
    PyObject *cell = args[0], *x = args[1], *h = args[2], *trace = args[3];
    void *h_pointer = NULL, *trace_pointer = NULL, *x_pointer = NULL;
    int yes = made_state(self, h, trace, &h_pointer, &trace_pointer);
    if (yes == 1) yes = (PyObject *)Py_TYPE(cell) == self->kind;
    if (yes == 1) {
        double decay = PyFloat_AsDouble(args[5]), rate = PyFloat_AsDouble(args[6]);
        if (PyErr_Occurred()) return NULL;
        yes = decay == self->decay && rate == self->rate;
    }
    if (yes == 1) yes = may_run(self->globals, self->name, self->library);
    if (yes == 1) {
        PyObject *parameters = PyObject_GetAttr(cell, s_parameters);
        if (parameters == NULL) return NULL;
        yes = same_parameters(&self->parameters, parameters);
        Py_DECREF(parameters);
    }
    if (yes == 1) yes = plain_cpu_tensor(x);
    long batch = self->made_batch, inputs = self->inputs;
    if (yes == 1) yes = matrix_of(x, self->dtype, &batch, &inputs);
    if (yes == 1 && data_ptr(x, &x_pointer)) return NULL;
    if (yes < 0) return NULL;
    int snap = yes ? PyObject_IsTrue(args[4]) : 0;
    if (snap < 0) return NULL;
    /* again after the checks, which call Python (a `load` that re-armed this object, say) */
    if (!yes || self->gradient == NULL || h != self->made_h || trace != self->made_trace) Py_RETURN_NONE;
    PyObject *h_new = new_empty(x, 2, batch, self->hidden, 0);
    if (h_new == NULL) return NULL;
    PyObject *trace_new = self->flat ? new_empty(x, 2, batch, self->hidden * self->columns, 0)
                                     : new_empty(x, 3, batch, self->hidden, self->columns);
    step_arguments arguments = {x_pointer, h_pointer, trace_pointer, NULL, NULL, batch};
    if (trace_new == NULL || data_ptr(h_new, &arguments.h_new) || data_ptr(trace_new, &arguments.trace_new)) {
        Py_DECREF(h_new);
        Py_XDECREF(trace_new);
        return NULL;
    }
    double total = (snap ? self->snap : self->rflo)(self->setup, &arguments);
    PyObject *sum = PyFloat_FromDouble(total);
    PyObject *result = sum ? PyTuple_Pack(3, h_new, trace_new, sum) : NULL;
    Py_XDECREF(sum);
    if (result != NULL) {
        Py_INCREF(h_new);
        Py_INCREF(trace_new);
        Py_XSETREF(self->made_h, h_new);
        Py_XSETREF(self->made_trace, trace_new);
        self->made_h_pointer = arguments.h_new;
        self->made_trace_pointer = arguments.trace_new;
    }
    Py_DECREF(h_new);
    Py_DECREF(trace_new);
    return result;
}

/* gradient(h, trace, grad_h) -> ({"weight_hh", "weight_ih", "bias"}, sum) or None */
static PyObject *FactoredTrace_gradient(FactoredTrace *self, PyObject *const *args, Py_ssize_t count) {
    if (count != 3) return PyErr_Format(PyExc_TypeError, "gradient(h, trace, grad_h) takes 3 arguments");
    PyObject *grad_h = args[2];
    void *h_pointer = NULL, *trace_pointer = NULL, *grad_pointer = NULL;
    int yes = made_state(self, args[0], args[1], &h_pointer, &trace_pointer);
    if (yes == 1) yes = may_run(self->globals, self->name, self->library);
    if (yes == 1) yes = plain_cpu_tensor(grad_h);
    long batch = self->made_batch, hidden = self->hidden;
    if (yes == 1) yes = matrix_of(grad_h, self->dtype, &batch, &hidden);
    if (yes == 1 && data_ptr(grad_h, &grad_pointer)) return NULL;
    if (yes < 0) return NULL;
    /* again after the checks, which call Python (a `load` that re-armed this object, say) */
    if (!yes || self->gradient == NULL || args[0] != self->made_h || args[1] != self->made_trace) Py_RETURN_NONE;
    PyObject *out_hh = new_empty(grad_h, 2, hidden, hidden, 0);
    PyObject *out_ih = out_hh ? new_empty(grad_h, 2, hidden, self->inputs, 0) : NULL;
    PyObject *out_b = out_ih ? new_empty(grad_h, 1, hidden, 0, 0) : NULL;
    PyObject *result = NULL, *estimate = NULL, *sum = NULL;
    gradient_arguments arguments = {trace_pointer, grad_pointer, NULL, NULL, NULL, batch};
    if (out_b == NULL || data_ptr(out_hh, &arguments.out_hh) || data_ptr(out_ih, &arguments.out_ih) ||
        data_ptr(out_b, &arguments.out_b))
        goto done;
    double total = self->gradient(self->setup, &arguments);
    estimate = PyDict_New();
    if (estimate == NULL || PyDict_SetItem(estimate, s_weight_hh, out_hh) ||
        PyDict_SetItem(estimate, s_weight_ih, out_ih) || PyDict_SetItem(estimate, s_bias, out_b))
        goto done;
    sum = PyFloat_FromDouble(total);
    if (sum != NULL) result = PyTuple_Pack(2, estimate, sum);
done:
    Py_XDECREF(out_hh);
    Py_XDECREF(out_ih);
    Py_XDECREF(out_b);
    Py_XDECREF(estimate);
    Py_XDECREF(sum);
    return result;
}

static PyMethodDef FactoredTrace_methods[] = {
    {"arm", (PyCFunction)FactoredTrace_arm, METH_VARARGS, "Arm with what the Python path checked."},
    {"made", (PyCFunction)(void (*)(void))FactoredTrace_made, METH_FASTCALL, "Remember a step of the Python path."},
    {"step", (PyCFunction)(void (*)(void))FactoredTrace_step, METH_FASTCALL, "The step, or None."},
    {"gradient", (PyCFunction)(void (*)(void))FactoredTrace_gradient, METH_FASTCALL, "The estimate, or None."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject FactoredTraceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lightning_ortho_fastcall.FactoredTrace",
    .tp_basicsize = sizeof(FactoredTrace),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)FactoredTrace_dealloc,
    .tp_traverse = (traverseproc)FactoredTrace_traverse,
    .tp_clear = (inquiry)FactoredTrace_clear,
    .tp_methods = FactoredTrace_methods,
};

/* == the module ================================================================================================== */
/* configure(Tensor, Parameter, is_compiling, dispatch_modes, functorch_level, jit_tracing, fx_state, fx_tracing,
 *           function_modes, has_storage, is_functional, autocast, load, its globals, environment_enabled,
 *           torch.nn.modules.module's globals, is_grad_enabled): the checks' callables, once */
static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *objects[17];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOO!OO!O", &objects[0], &objects[1], &objects[2], &objects[3], &objects[4],
                          &objects[5], &objects[6], &objects[7], &objects[8], &objects[9], &objects[10], &objects[11],
                          &objects[12], &PyDict_Type, &objects[13], &objects[14], &PyDict_Type, &objects[15],
                          &objects[16]))
        return NULL;
    PyObject **slots[] = {&tensor_type,    &parameter_type, &is_compiling, &dispatch_modes, &functorch_level,
                          &jit_tracing,    &fx_state,       &fx_tracing,   &function_modes, &has_storage,
                          &is_functional,  &autocast,       &native_load,  &native_globals, &environment_enabled,
                          &module_globals, &grad_enabled};
    for (int i = 0; i < 17; i++) {
        Py_INCREF(objects[i]);
        Py_XSETREF(*slots[i], objects[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "Give the checks' callables (once, at load)."}, {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_definition = {PyModuleDef_HEAD_INIT, "fastcall", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_fastcall(void) {
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&s_data_ptr, "data_ptr"},     {&s_is_cpu, "is_cpu"},       {&s_is_neg, "is_neg"},
                 {&s_is_contiguous, "is_contiguous"}, {&s_new_empty, "new_empty"}, {&s_dtype, "dtype"},
                 {&s_shape, "shape"},           {&s_load, "load"},           {&s_parameters, "_parameters"},
                 {&s_weight_hh, "weight_hh"},   {&s_weight_ih, "weight_ih"}, {&s_bias, "bias"},
                 {&s___dict__, "__dict__"},     {&s_flag, "flag"},           {&s_switch, "_switch"},
                 {&s_forward, "forward"},       {&s_compiled_call_impl, "_compiled_call_impl"},
                 {&s_hooks[0], "_forward_hooks"},  {&s_hooks[1], "_forward_pre_hooks"},
                 {&s_hooks[2], "_backward_hooks"}, {&s_hooks[3], "_backward_pre_hooks"},
                 {&s_global_hooks[0], "_global_forward_hooks"},  {&s_global_hooks[1], "_global_forward_pre_hooks"},
                 {&s_global_hooks[2], "_global_backward_hooks"}, {&s_global_hooks[3], "_global_backward_pre_hooks"}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    if (PyType_Ready(&TanhForwardType) < 0 || PyType_Ready(&FactoredTraceType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL) return NULL;
    Py_INCREF(&TanhForwardType);
    Py_INCREF(&FactoredTraceType);
    if (PyModule_AddObject(module, "TanhForward", (PyObject *)&TanhForwardType) < 0 ||
        PyModule_AddObject(module, "FactoredTrace", (PyObject *)&FactoredTraceType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
