/* The SHA-256 digests of a batch of ingested records, computed without the GIL.
 *
 * sha256_many(prefixes, payloads) -> (ids, shas), exactly what mmlake.ingest.wire._sha256_many_py
 * returns: for each payload, the hex SHA-256 of prefix + payload (None where the prefix is None) and
 * the hex SHA-256 of the payload alone. hashlib holds the GIL for inputs under 2 KiB, so hashing a text
 * record (two digests of ~1 KB) stopped the fetch thread's Python work for as long; here the buffers are
 * taken under the GIL, the whole batch is hashed (libcrypto) with it released, and the hex strings are
 * made under it again. Built where a C compiler and libcrypto are found; otherwise wire.py uses Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>

#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#define FETCH_SHA256() EVP_MD_fetch(NULL, "SHA256", NULL)
#define FREE_MD(md) EVP_MD_free(md)
#else
#define FETCH_SHA256() ((EVP_MD *)EVP_sha256())
#define FREE_MD(md) ((void)(md))
#endif

#define DIGEST 32

typedef struct {
    Py_buffer payload;
    Py_buffer prefix;
    int has_prefix;
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

/* Hash every item; 0 on success. Runs without the GIL: touches only the buffers and the items. */
static int hash_all(item_t *items, Py_ssize_t n) {
    EVP_MD *md = FETCH_SHA256();
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = md != NULL && ctx != NULL;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        item_t *it = &items[i];
        if (it->has_prefix) {
            ok = EVP_DigestInit_ex(ctx, md, NULL) && EVP_DigestUpdate(ctx, it->prefix.buf, (size_t)it->prefix.len) &&
                 EVP_DigestUpdate(ctx, it->payload.buf, (size_t)it->payload.len) &&
                 EVP_DigestFinal_ex(ctx, it->id, NULL);
        }
        ok = ok && EVP_DigestInit_ex(ctx, md, NULL) &&
             EVP_DigestUpdate(ctx, it->payload.buf, (size_t)it->payload.len) && EVP_DigestFinal_ex(ctx, it->sha, NULL);
    }
    if (ctx != NULL) EVP_MD_CTX_free(ctx);
    if (md != NULL) FREE_MD(md);
    return ok ? 0 : -1;
}

static PyObject *sha256_many(PyObject *self, PyObject *args) {
    PyObject *prefixes_arg, *payloads_arg;
    if (!PyArg_ParseTuple(args, "OO:sha256_many", &prefixes_arg, &payloads_arg)) return NULL;
    PyObject *prefixes = PySequence_Fast(prefixes_arg, "prefixes must be a sequence");
    if (prefixes == NULL) return NULL;
    PyObject *payloads = PySequence_Fast(payloads_arg, "payloads must be a sequence");
    if (payloads == NULL) {
        Py_DECREF(prefixes);
        return NULL;
    }
    PyObject *result = NULL, *ids = NULL, *shas = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(payloads), taken = 0;
    item_t *items = NULL;
    if (PySequence_Fast_GET_SIZE(prefixes) != n) {
        PyErr_SetString(PyExc_ValueError, "prefixes and payloads differ in length");
        goto done;
    }
    items = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(item_t));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; taken < n; taken++) {
        item_t *it = &items[taken];
        PyObject *prefix = PySequence_Fast_GET_ITEM(prefixes, taken);
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(payloads, taken), &it->payload, PyBUF_SIMPLE) < 0) goto done;
        if (prefix != Py_None) {
            if (PyObject_GetBuffer(prefix, &it->prefix, PyBUF_SIMPLE) < 0) {
                PyBuffer_Release(&it->payload);
                goto done;
            }
            it->has_prefix = 1;
        }
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = hash_all(items, n);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto could not compute SHA-256");
        goto done;
    }
    ids = PyList_New(n);
    shas = PyList_New(n);
    if (ids == NULL || shas == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id;
        if (items[i].has_prefix) {
            id = hex_of(items[i].id);
            if (id == NULL) goto done;
        } else {
            id = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(ids, i, id);
        PyObject *sha = hex_of(items[i].sha);
        if (sha == NULL) goto done;
        PyList_SET_ITEM(shas, i, sha);
    }
    result = PyTuple_Pack(2, ids, shas);
done:
    for (Py_ssize_t i = 0; i < taken; i++) {
        PyBuffer_Release(&items[i].payload);
        if (items[i].has_prefix) PyBuffer_Release(&items[i].prefix);
    }
    PyMem_Free(items);
    Py_XDECREF(ids);
    Py_XDECREF(shas);
    Py_DECREF(prefixes);
    Py_DECREF(payloads);
    return result;
}

static PyMethodDef methods[] = {
    {"sha256_many", sha256_many, METH_VARARGS,
     "sha256_many(prefixes, payloads) -> (ids, shas): for each payload, the hex SHA-256 of prefix + payload "
     "(None where the prefix is None) and of the payload alone; hashed without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_digest", NULL, -1, methods};

PyMODINIT_FUNC PyInit__digest(void) { return PyModule_Create(&module); }
