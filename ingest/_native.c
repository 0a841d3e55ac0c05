/* The per-record work of ingest that Python does slowest, for the common case, in C.
 *
 * check_text(key, value, headers, max_payload_bytes, not_after_us) -> Checked | None: what
 * mmlake.ingest.wire.check returns for a text record that meets the contract in the plain way (every
 * header name ASCII, every value present and UTF-8, the event time epoch milliseconds of at most 13
 * digits, modality "text", a UTF-8 payload); None for anything else, which wire.check then judges in
 * Python, rule by rule. So this code never rejects and never needs to agree on a message: it only
 * recognises records the Python rules would accept, and computes what they would.
 *
 * accept_many(checked, payloads) -> [Accepted]: wire.digest's result (each payload's SHA-256 and the
 * default record id), the whole batch hashed by libcrypto with the GIL released: hashlib holds the GIL
 * for inputs under 2 KiB, so hashing a text record (two digests of ~1 KB) stopped the fetch thread's
 * Python work for as long.
 *
 * gather(values, target): the values' bytes one after another into a writable buffer (an Arrow buffer:
 * its allocator keeps the pages between batches, where bytes.join faulted in fresh ones every batch),
 * copied without the GIL.
 *
 * headers_ok(headers): whether confluent-kafka's headers of a message can be read (see
 * mmlake.ingest.recovery._headers, which checks the same in Python without the module).
 *
 * configure(Checked, Accepted) gives the module the two named-tuple classes it builds. Built where a
 * C compiler and libcrypto are found; otherwise wire.py does all of this in Python (the tests compare).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
/* SHA256_Init/Update/Final are deprecated in OpenSSL 3 (for EVP) but kept; see hash_all. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#define DIGEST 32
#define PREFIX_MAX 48 /* "image" NUL, an int64 in decimal, NUL */

static PyObject *checked_type = NULL, *accepted_type = NULL, *text_str = NULL, *text_plain_str = NULL;

/* ---- check_text --------------------------------------------------------------------------------- */

/* Whether s[0..n) is what Python's strict UTF-8 decoder accepts: no overlong forms, no surrogates,
 * nothing beyond U+10FFFF, nothing truncated. */
static int utf8_valid(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        unsigned c = s[i];
        if (c < 0x80) {
            i += 1;
        } else if (c < 0xC2) {
            return 0;
        } else if (c < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c < 0xF0) {
            if (i + 2 >= n) return 0;
            unsigned c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;  /* overlong */
            if (c == 0xED && c1 >= 0xA0) return 0; /* a surrogate */
            i += 3;
        } else if (c < 0xF5) {
            if (i + 3 >= n) return 0;
            unsigned c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;  /* overlong */
            if (c == 0xF4 && c1 >= 0x90) return 0; /* beyond U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Whether the ASCII str `name` equals `lower` (lower-case ASCII) ignoring case. */
static int name_is(const char *name, Py_ssize_t len, const char *lower) {
    Py_ssize_t n = (Py_ssize_t)strlen(lower);
    if (len != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = name[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != lower[i]) return 0;
    }
    return 1;
}

enum { H_EVENT_TIME, H_MODALITY, H_CONTENT_TYPE, H_RECORD_ID, H_SAMPLE_ID, H_COUNT };
static const char *const HEADER_NAMES[H_COUNT] = {"mm-event-time", "mm-modality", "content-type", "mm-record-id",
                                                  "mm-sample-id"};

/* The decoded text of a (validated) bytes value, or NULL with no error set for an empty one. */
static PyObject *text_or_null(PyObject *value, int *failed) {
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    if (n == 0) return NULL;
    PyObject *out = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(value), n, "strict");
    if (out == NULL) *failed = 1;
    return out;
}

static PyObject *check_text(PyObject *self, PyObject *args) {
    PyObject *key, *value, *headers_arg, *not_after_obj;
    Py_ssize_t max_payload;
    if (!PyArg_ParseTuple(args, "OOOnO:check_text", &key, &value, &headers_arg, &max_payload, &not_after_obj))
        return NULL;
    if (checked_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key))) Py_RETURN_NONE;
    PyObject *headers = PySequence_Fast(headers_arg, "headers must be a sequence");
    if (headers == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *found[H_COUNT] = {NULL}; /* borrowed: the last value of each header that counts */
    int plain = 1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(headers);
    for (Py_ssize_t i = 0; plain && i < count; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            plain = 0;
            break;
        }
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *raw = PyTuple_GET_ITEM(pair, 1);
        if (name == NULL || raw == NULL || !PyUnicode_CheckExact(name) || !PyUnicode_IS_ASCII(name) ||
            !PyBytes_CheckExact(raw) ||
            !utf8_valid((const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))) {
            plain = 0;
            break;
        }
        const char *chars = (const char *)PyUnicode_1BYTE_DATA(name);
        Py_ssize_t len = PyUnicode_GET_LENGTH(name);
        for (int h = 0; h < H_COUNT; h++) {
            if (name_is(chars, len, HEADER_NAMES[h])) {
                found[h] = raw;
                break;
            }
        }
    }
    PyObject *result = NULL;
    if (!plain) goto plain_none;
    if (key != Py_None && !utf8_valid((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)))
        goto plain_none;
    /* The event time: epoch milliseconds of 1 to 13 ASCII digits (always within years 1..9999). */
    PyObject *time_raw = found[H_EVENT_TIME];
    if (time_raw == NULL) goto plain_none;
    Py_ssize_t tlen = PyBytes_GET_SIZE(time_raw);
    const char *tchars = PyBytes_AS_STRING(time_raw);
    if (tlen < 1 || tlen > 13) goto plain_none;
    long long ms = 0;
    for (Py_ssize_t i = 0; i < tlen; i++) {
        if (tchars[i] < '0' || tchars[i] > '9') goto plain_none;
        ms = ms * 10 + (tchars[i] - '0');
    }
    long long us = ms * 1000;
    if (not_after_obj != Py_None) {
        int overflow = 0;
        long long not_after = PyLong_AsLongLongAndOverflow(not_after_obj, &overflow);
        if (not_after == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto plain_none;
        }
        if (overflow < 0 || (overflow == 0 && us > not_after)) goto plain_none;
    }
    PyObject *modality = found[H_MODALITY];
    if (modality == NULL || PyBytes_GET_SIZE(modality) != 4 || memcmp(PyBytes_AS_STRING(modality), "text", 4) != 0)
        goto plain_none;
    Py_ssize_t size = PyBytes_GET_SIZE(value);
    if (size > max_payload) goto plain_none;
    PyObject *declared = found[H_CONTENT_TYPE];
    if (declared != NULL) { /* must start with "text/" whatever the case: the first 5 bytes ASCII */
        const char *d = PyBytes_AS_STRING(declared);
        if (PyBytes_GET_SIZE(declared) < 5) goto plain_none;
        for (int i = 0; i < 5; i++) {
            char c = d[i];
            if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
            if (c != "text/"[i]) goto plain_none;
        }
    }
    if (!utf8_valid((const unsigned char *)PyBytes_AS_STRING(value), size)) goto plain_none;

    int failed = 0;
    PyObject *content_type = declared != NULL ? text_or_null(declared, &failed) : Py_NewRef(text_plain_str);
    PyObject *record_id = found[H_RECORD_ID] != NULL ? text_or_null(found[H_RECORD_ID], &failed) : NULL;
    PyObject *sample_id = found[H_SAMPLE_ID] != NULL ? text_or_null(found[H_SAMPLE_ID], &failed) : NULL;
    if (sample_id == NULL && !failed && key != Py_None) sample_id = text_or_null(key, &failed);
    if (!failed) {
        PyObject *t = PyLong_FromLongLong(us);
        PyObject *items = t == NULL ? NULL
                                    : PyTuple_Pack(5, record_id ? record_id : Py_None, sample_id ? sample_id : Py_None,
                                                   text_str, content_type, t);
        Py_XDECREF(t);
        if (items != NULL) {
            PyObject *wrapped = PyTuple_Pack(1, items);
            if (wrapped != NULL) {
                result = PyTuple_Type.tp_new((PyTypeObject *)checked_type, wrapped, NULL);
                Py_DECREF(wrapped);
            }
            Py_DECREF(items);
        }
    }
    Py_XDECREF(content_type);
    Py_XDECREF(record_id);
    Py_XDECREF(sample_id);
    Py_DECREF(headers);
    return result;
plain_none:
    Py_DECREF(headers);
    Py_RETURN_NONE;
}

/* ---- accept_many -------------------------------------------------------------------------------- */

typedef struct {
    Py_buffer payload;
    unsigned char prefix[PREFIX_MAX];
    size_t prefix_len; /* 0: the record names its own id */
    unsigned char id[DIGEST];
    unsigned char sha[DIGEST];
} item_t;

static PyObject *hex_of(const unsigned char *digest) {
    static const char hexdigits[] = "0123456789abcdef";
    PyObject *out = PyUnicode_New(2 * DIGEST, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *data = PyUnicode_1BYTE_DATA(out);
    for (int i = 0; i < DIGEST; i++) {
        data[2 * i] = (Py_UCS1)hexdigits[digest[i] >> 4];
        data[2 * i + 1] = (Py_UCS1)hexdigits[digest[i] & 15];
    }
    return out;
}

/* Hash items [from, to). Runs without the GIL: touches only the buffers and the items. SHA256_Init/
 * Update/Final rather than EVP: the same assembly (SHA-NI where the CPU has it), without OpenSSL 3's
 * per-init provider dispatch. */
static void hash_range(item_t *items, Py_ssize_t from, Py_ssize_t to) {
    SHA256_CTX ctx;
    for (Py_ssize_t i = from; i < to; i++) {
        item_t *it = &items[i];
        if (it->prefix_len) {
            SHA256_Init(&ctx);
            SHA256_Update(&ctx, it->prefix, it->prefix_len);
            SHA256_Update(&ctx, it->payload.buf, (size_t)it->payload.len);
            SHA256_Final(it->id, &ctx);
        }
        SHA256(it->payload.buf, (size_t)it->payload.len, it->sha);
    }
}

typedef struct {
    item_t *items;
    Py_ssize_t from, to;
} range_t;

static void *hash_range_thread(void *arg) {
    range_t *r = arg;
    hash_range(r->items, r->from, r->to);
    return NULL;
}

/* A batch this large is hashed by two threads, its second half by a helper (a batch of images is 64 MB:
 * its digests were a quarter of the time the last batch of a run takes, with a core idle). */
#define SPLIT_BYTES (4 << 20)

static void hash_all(item_t *items, Py_ssize_t n, Py_ssize_t total) {
    if (total < SPLIT_BYTES || n < 2) {
        hash_range(items, 0, n);
        return;
    }
    Py_ssize_t half = 0, seen = 0;
    while (half < n && seen < total / 2) seen += items[half++].payload.len;
    range_t second = {items, half, n};
    pthread_t helper;
    if (pthread_create(&helper, NULL, hash_range_thread, &second) != 0) {
        hash_range(items, 0, n); /* no thread to be had: all here */
        return;
    }
    hash_range(items, 0, half);
    pthread_join(helper, NULL);
}

/* A non-empty str, or NULL (None, "", anything else). Borrowed. */
static PyObject *given(PyObject *o) { return PyUnicode_Check(o) && PyUnicode_GET_LENGTH(o) > 0 ? o : NULL; }

static PyObject *accept_many(PyObject *self, PyObject *args) {
    PyObject *checked_arg, *payloads_arg;
    if (!PyArg_ParseTuple(args, "OO:accept_many", &checked_arg, &payloads_arg)) return NULL;
    if (accepted_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    PyObject *checked = PySequence_Fast(checked_arg, "checked must be a sequence");
    if (checked == NULL) return NULL;
    PyObject *payloads = PySequence_Fast(payloads_arg, "payloads must be a sequence");
    if (payloads == NULL) {
        Py_DECREF(checked);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(payloads), taken = 0, total = 0;
    item_t *items = NULL;
    if (PySequence_Fast_GET_SIZE(checked) != n) {
        PyErr_SetString(PyExc_ValueError, "checked and payloads differ in length");
        goto done;
    }
    items = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(item_t));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; taken < n; taken++) {
        item_t *it = &items[taken];
        PyObject *c = PySequence_Fast_GET_ITEM(checked, taken);
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 5) {
            PyErr_SetString(PyExc_TypeError, "each checked record must be a 5-tuple (a Checked)");
            goto done;
        }
        if (given(PyTuple_GET_ITEM(c, 0)) == NULL) { /* the default id: modality NUL time NUL payload */
            Py_ssize_t mlen;
            const char *m = PyUnicode_Check(PyTuple_GET_ITEM(c, 2)) ? PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(c, 2), &mlen)
                                                                     : NULL;
            long long t = PyLong_AsLongLong(PyTuple_GET_ITEM(c, 4));
            if (m == NULL || (t == -1 && PyErr_Occurred())) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a checked record's modality must be a str");
                goto done;
            }
            if (mlen > 16) {
                PyErr_SetString(PyExc_ValueError, "modality too long");
                goto done;
            }
            int written = snprintf((char *)it->prefix + mlen + 1, PREFIX_MAX - (size_t)mlen - 1, "%lld", t);
            memcpy(it->prefix, m, (size_t)mlen);
            it->prefix[mlen] = 0;
            it->prefix_len = (size_t)mlen + 1 + (size_t)written + 1;
            it->prefix[it->prefix_len - 1] = 0;
        }
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(payloads, taken), &it->payload, PyBUF_SIMPLE) < 0) goto done;
        total += it->payload.len;
    }
    Py_BEGIN_ALLOW_THREADS
    hash_all(items, n, total);
    Py_END_ALLOW_THREADS
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PySequence_Fast_GET_ITEM(checked, i);
        PyObject *rid = given(PyTuple_GET_ITEM(c, 0));
        PyObject *own = rid != NULL ? Py_NewRef(rid) : hex_of(items[i].id);
        PyObject *sha = own != NULL ? hex_of(items[i].sha) : NULL;
        PyObject *sample = given(PyTuple_GET_ITEM(c, 1));
        PyObject *fields = sha == NULL ? NULL
                                       : PyTuple_Pack(6, own, sample != NULL ? sample : own, PyTuple_GET_ITEM(c, 2),
                                                      PyTuple_GET_ITEM(c, 3), PyTuple_GET_ITEM(c, 4), sha);
        PyObject *wrapped = fields != NULL ? PyTuple_Pack(1, fields) : NULL;
        PyObject *acc = wrapped != NULL ? PyTuple_Type.tp_new((PyTypeObject *)accepted_type, wrapped, NULL) : NULL;
        Py_XDECREF(own);
        Py_XDECREF(sha);
        Py_XDECREF(fields);
        Py_XDECREF(wrapped);
        if (acc == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, acc);
    }
done:
    for (Py_ssize_t i = 0; i < taken; i++) PyBuffer_Release(&items[i].payload);
    PyMem_Free(items);
    Py_DECREF(checked);
    Py_DECREF(payloads);
    return out;
}

/* ---- gather ------------------------------------------------------------------------------------- */

static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *values_arg, *target;
    if (!PyArg_ParseTuple(args, "OO:gather", &values_arg, &target)) return NULL;
    PyObject *values = PySequence_Fast(values_arg, "values must be a sequence");
    if (values == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values), taken = 0, total = 0;
    Py_buffer out;
    PyObject *result = NULL;
    Py_buffer *parts = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    if (parts == NULL) {
        Py_DECREF(values);
        return PyErr_NoMemory();
    }
    if (PyObject_GetBuffer(target, &out, PyBUF_WRITABLE) < 0) goto done;
    for (; taken < n; taken++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(values, taken), &parts[taken], PyBUF_SIMPLE) < 0) break;
        total += parts[taken].len;
    }
    if (taken == n && total > out.len) PyErr_SetString(PyExc_ValueError, "the target is smaller than the values");
    if (taken == n && total <= out.len) {
        Py_BEGIN_ALLOW_THREADS
        char *at = out.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            memcpy(at, parts[i].buf, (size_t)parts[i].len);
            at += parts[i].len;
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromSsize_t(total);
    }
    PyBuffer_Release(&out);
done:
    for (Py_ssize_t i = 0; i < taken; i++) PyBuffer_Release(&parts[i]);
    PyMem_Free(parts);
    Py_DECREF(values);
    return result;
}

/* ---- headers_ok --------------------------------------------------------------------------------- */

static PyObject *headers_ok(PyObject *self, PyObject *raw) {
    /* The binding may return the headers with its decoding error still set. A call to a built-in like
     * this one is not checked for that once the interpreter has specialised it: raise the error here,
     * where the caller's try expects it, not at some later call. */
    if (PyErr_Occurred()) return NULL;
    PyObject *items = PySequence_Fast(raw, "headers must be a sequence");
    if (items == NULL) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || PyTuple_GET_ITEM(pair, 0) == NULL ||
            PyTuple_GET_ITEM(pair, 1) == NULL || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
            ok = 0;
        } else if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), NULL) == NULL) {
            PyErr_Clear(); /* a key holding surrogates */
            ok = 0;
        }
    }
    Py_DECREF(items);
    return PyBool_FromLong(ok);
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *checked, *accepted;
    if (!PyArg_ParseTuple(args, "O!O!:configure", &PyType_Type, &checked, &PyType_Type, &accepted)) return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)checked, &PyTuple_Type) ||
        !PyType_IsSubtype((PyTypeObject *)accepted, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "both types must be tuple subclasses");
        return NULL;
    }
    Py_XSETREF(checked_type, Py_NewRef(checked));
    Py_XSETREF(accepted_type, Py_NewRef(accepted));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"check_text", check_text, METH_VARARGS,
     "check_text(key, value, headers, max_payload_bytes, not_after_us) -> Checked | None (see the module source)."},
    {"accept_many", accept_many, METH_VARARGS,
     "accept_many(checked, payloads) -> [Accepted]: the digests of a batch, hashed without the GIL."},
    {"gather", gather, METH_VARARGS,
     "gather(values, target) -> int: the values' bytes one after another into the writable buffer target, "
     "copied without the GIL; how many bytes."},
    {"headers_ok", headers_ok, METH_O,
     "headers_ok(headers) -> bool: every header a pair with both items present and a key that is str and "
     "UTF-8 (confluent-kafka builds a key that is not UTF-8 as a pair with a missing item)."},
    {"configure", configure, METH_VARARGS, "configure(Checked, Accepted): the classes the module builds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

/* What the Python side checks before using the module: a build older than the Python code that calls
 * it (an editable install not rebuilt) is not used at all. Raise it with every change of the API. */
#define API 5

PyMODINIT_FUNC PyInit__native(void) {
    text_str = PyUnicode_InternFromString("text");
    text_plain_str = PyUnicode_InternFromString("text/plain; charset=utf-8");
    if (text_str == NULL || text_plain_str == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "API", API) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
