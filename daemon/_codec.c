/* worldline.daemon._codec: the hot path's encodings, without a Python loop per item.
 * Each is byte for byte its Python twin, and tests/test_fuzz.py holds them to it.
 *
 * pack_hex(data) -> bytes, unpack_hex(packed) -> bytes: the pack's hex packing
 * (daemon/storage/packs.py). Every run of 32 or more lowercase hex digits, taken two by two
 * from its start (the regex (?:[0-9a-f]{2}){16,}), is replaced by the bytes it spells.
 * The packed form is varint(literal length), literal, varint(run length), run, ...,
 * a literal last.
 *
 * shared_ends(base, data) -> (prefix, suffix): the lengths of the prefix data shares with
 * base, and of the suffix they share in what is left after that prefix (the splice
 * delta's two ends, daemon/storage/packs.py).
 *
 * copy_delta(base, data) -> bytes, apply_copies(base, delta, size) -> bytes: the pack's
 * copy/insert delta (``COPIES`` rows, daemon/storage/packs.py, which holds the format and
 * the Python twins).
 *
 * encode_tree(items, codes) -> bytes: a tree's canonical JSON (daemon/capture/trees.py), from
 * its (name, Entry) pairs sorted by name: json.dumps of [[name, codes[kind], mode, ref,
 * size], ...] with ensure_ascii and the separators "," and ":"; an entry whose uid is
 * not -1 (one with an owner) adds uid, gid, mtime and extra to its row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const signed char NIBBLE[256] = {
    ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7,
    ['7'] = 8, ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14,
    ['e'] = 15, ['f'] = 16,
}; /* value + 1 for a lowercase hex digit, 0 otherwise */

static unsigned char *put_varint(unsigned char *out, size_t n) {
    for (;;) {
        unsigned char byte = n & 0x7F;
        n >>= 7;
        *out++ = byte | (n ? 0x80 : 0);
        if (!n)
            return out;
    }
}

static PyObject *pack_hex(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    size_t len = (size_t)view.len;
    /* never longer than the input plus one varint per 32 bytes (each run halves) */
    size_t cap = len + 10 * (len / 32 + 2);
    unsigned char *buf = PyMem_Malloc(cap);
    if (buf == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    unsigned char *out = buf;
    size_t at = 0, i = 0;
    while (i < len) {
        if (!NIBBLE[data[i]]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < len && NIBBLE[data[j]])
            j++;
        size_t run = (j - i) & ~(size_t)1;
        if (run < 32) {
            i = j;
            continue;
        }
        out = put_varint(out, i - at);
        memcpy(out, data + at, i - at);
        out += i - at;
        out = put_varint(out, run / 2);
        for (size_t k = i; k < i + run; k += 2)
            *out++ = (unsigned char)(((NIBBLE[data[k]] - 1) << 4) | (NIBBLE[data[k + 1]] - 1));
        at = i = i + run;
    }
    out = put_varint(out, len - at);
    memcpy(out, data + at, len - at);
    out += len - at;
    PyBuffer_Release(&view);
    PyObject *result = PyBytes_FromStringAndSize((const char *)buf, out - buf);
    PyMem_Free(buf);
    return result;
}

static int read_varint(const unsigned char *data, size_t len, size_t *at, size_t *n) {
    uint64_t value = 0;
    unsigned shift = 0;
    int huge = 0;
    for (;;) {
        if (*at >= len || shift > 63) {
            PyErr_SetString(PyExc_ValueError, "a varint is cut short");
            return -1;
        }
        unsigned char byte = data[(*at)++];
        if (shift > 56 && (byte & 0x7F) >> (64 - shift))
            huge = 1; /* past 64 bits: no chunk can be that long */
        value |= (uint64_t)(byte & 0x7F) << shift;
        shift += 7;
        if (!(byte & 0x80)) {
            *n = huge ? SIZE_MAX : (size_t)value;
            return 0;
        }
    }
}

static PyObject *unpack_hex(PyObject *Py_UNUSED(self), PyObject *arg) {
    static const char HEX[] = "0123456789abcdef";
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    size_t len = (size_t)view.len;
    /* first pass: the output's length, and every error the Python codec raises */
    size_t at = 0, total = 0, n;
    int literal = 1;
    for (;;) {
        if (read_varint(data, len, &at, &n) < 0)
            goto fail;
        if (n > len - at) {
            PyErr_SetString(PyExc_ValueError, "a packed blob is cut short");
            goto fail;
        }
        total += literal ? n : 2 * n;
        at += n;
        if (literal && at == len)
            break;
        literal = !literal;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL)
        goto fail;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    at = 0;
    literal = 1;
    for (;;) {
        read_varint(data, len, &at, &n); /* cannot fail: checked above */
        if (literal) {
            memcpy(out, data + at, n);
            out += n;
        } else {
            for (size_t k = 0; k < n; k++) {
                *out++ = (unsigned char)HEX[data[at + k] >> 4];
                *out++ = (unsigned char)HEX[data[at + k] & 15];
            }
        }
        at += n;
        if (literal && at == len)
            break;
        literal = !literal;
    }
    PyBuffer_Release(&view);
    return result;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* -- trees ---------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
} out_t;

static int grow(out_t *o, size_t extra) {
    if (o->len + extra <= o->cap)
        return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (o->len + extra > cap)
        cap *= 2;
    char *buf = PyMem_Realloc(o->buf, cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = buf;
    o->cap = cap;
    return 0;
}

static int put(out_t *o, const char *s, size_t n) {
    if (grow(o, n) < 0)
        return -1;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    return 0;
}

/* A JSON string as json.dumps(ensure_ascii=True) writes it (lowercase \u escapes). An
 * ASCII string with nothing to escape (names, digests, codes: nearly every one) is one
 * scan and one copy; any other goes character by character. */
static int put_string(out_t *o, PyObject *text) {
    static const char HEX[] = "0123456789abcdef";
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "tree names, codes and refs are str");
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (PyUnicode_IS_ASCII(text)) {
        const unsigned char *a = PyUnicode_1BYTE_DATA(text);
        Py_ssize_t i = 0;
        while (i < n && a[i] >= ' ' && a[i] <= '~' && a[i] != '\\' && a[i] != '"')
            i++;
        if (i == n) {
            if (grow(o, (size_t)n + 2) < 0)
                return -1;
            char *w = o->buf + o->len;
            *w++ = '"';
            memcpy(w, a, (size_t)n);
            w[n] = '"';
            o->len += (size_t)n + 2;
            return 0;
        }
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (grow(o, (size_t)n * 12 + 2) < 0) /* the longest escape: a surrogate pair */
        return -1;
    char *w = o->buf + o->len;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '\\' && c != '"') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '\\': *w++ = '\\'; break;
        case '"': *w++ = '"'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        default:
            if (c >= 0x10000) { /* a surrogate pair, as json writes it */
                Py_UCS4 v = c - 0x10000;
                Py_UCS4 hi = 0xd800 | ((v >> 10) & 0x3ff);
                *w++ = 'u';
                *w++ = HEX[(hi >> 12) & 15];
                *w++ = HEX[(hi >> 8) & 15];
                *w++ = HEX[(hi >> 4) & 15];
                *w++ = HEX[hi & 15];
                c = 0xdc00 | (v & 0x3ff);
                *w++ = '\\';
            }
            *w++ = 'u';
            *w++ = HEX[(c >> 12) & 15];
            *w++ = HEX[(c >> 8) & 15];
            *w++ = HEX[(c >> 4) & 15];
            *w++ = HEX[c & 15];
        }
    }
    *w++ = '"';
    o->len = (size_t)(w - o->buf);
    return 0;
}

/* An int as json writes it (its decimal digits, a minus sign before a negative one).
 * One that does not fit 64 bits is written by Python's own str(). */
static int put_int(out_t *o, PyObject *value) {
    if (!PyLong_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "tree modes and sizes are int");
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow) { /* json writes any int, however long: so do we */
        PyObject *text = PyObject_Str(value);
        if (text == NULL)
            return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(text, &n);
        int r = s == NULL ? -1 : put(o, s, (size_t)n);
        Py_DECREF(text);
        return r;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    /* digits from the last: unsigned, so that the most negative value negates too */
    char digits[24];
    char *end = digits + sizeof digits, *d = end;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--d = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--d = '-';
    return put(o, d, (size_t)(end - d));
}

static PyObject *encode_tree(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *items, *codes;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &items, &PyDict_Type, &codes))
        return NULL;
    static PyObject *s_kind, *s_mode, *s_ref, *s_size, *s_uid, *s_gid, *s_mtime, *s_extra;
    if (s_kind == NULL) {
        s_kind = PyUnicode_InternFromString("kind");
        s_mode = PyUnicode_InternFromString("mode");
        s_ref = PyUnicode_InternFromString("ref");
        s_size = PyUnicode_InternFromString("size");
        s_uid = PyUnicode_InternFromString("uid");
        s_gid = PyUnicode_InternFromString("gid");
        s_mtime = PyUnicode_InternFromString("mtime");
        s_extra = PyUnicode_InternFromString("extra");
        if (!s_kind || !s_mode || !s_ref || !s_size || !s_uid || !s_gid || !s_mtime ||
            !s_extra)
            return NULL;
    }
    out_t o = {0};
    if (put(&o, "[", 1) < 0)
        goto fail;
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "items are (name, Entry) pairs");
            goto fail;
        }
        PyObject *entry = PyTuple_GET_ITEM(item, 1);
        PyObject *kind = PyObject_GetAttr(entry, s_kind);
        PyObject *code = kind ? PyDict_GetItemWithError(codes, kind) : NULL; /* borrowed */
        Py_XDECREF(kind);
        if (code == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "an entry of an unknown kind");
            goto fail;
        }
        PyObject *fields[8] = {NULL};
        PyObject *names[8] = {s_mode, s_ref, s_size, s_uid, s_gid, s_mtime, s_extra, NULL};
        int bad = 0;
        for (int f = 0; names[f] != NULL && !bad; f++)
            bad = (fields[f] = PyObject_GetAttr(entry, names[f])) == NULL;
        int owned = 0;
        if (!bad) {
            long uid = PyLong_AsLong(fields[3]);
            bad = uid == -1 && PyErr_Occurred();
            owned = uid != -1;
        }
        bad = bad || put(&o, i ? ",[" : "[", i ? 2 : 1) < 0 ||
              put_string(&o, PyTuple_GET_ITEM(item, 0)) < 0 || put(&o, ",", 1) < 0 ||
              put_string(&o, code) < 0 || put(&o, ",", 1) < 0 ||
              put_int(&o, fields[0]) < 0 || put(&o, ",", 1) < 0 ||
              put_string(&o, fields[1]) < 0 || put(&o, ",", 1) < 0 ||
              put_int(&o, fields[2]) < 0;
        if (!bad && owned)
            bad = put(&o, ",", 1) < 0 || put_int(&o, fields[3]) < 0 || put(&o, ",", 1) < 0 ||
                  put_int(&o, fields[4]) < 0 || put(&o, ",", 1) < 0 ||
                  put_int(&o, fields[5]) < 0 || put(&o, ",", 1) < 0 ||
                  put_string(&o, fields[6]) < 0;
        bad = bad || put(&o, "]", 1) < 0;
        for (int f = 0; f < 7; f++)
            Py_XDECREF(fields[f]);
        if (bad)
            goto fail;
    }
    if (put(&o, "]", 1) < 0)
        goto fail;
    PyObject *result = PyBytes_FromStringAndSize(o.buf, (Py_ssize_t)o.len);
    PyMem_Free(o.buf);
    return result;
fail:
    PyMem_Free(o.buf);
    return NULL;
}

/* The length of the longest common prefix of a and b, n bytes at most: eight bytes a
 * step while they agree, then byte by byte. */
static size_t common_prefix(const unsigned char *a, const unsigned char *b, size_t n) {
    size_t i = 0;
    while (i + 8 <= n) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y)
            break;
        i += 8;
    }
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* The length of the longest common suffix of a[..la] and b[..lb], n bytes at most. */
static size_t common_suffix(const unsigned char *a, size_t la, const unsigned char *b,
                            size_t lb, size_t n) {
    size_t i = 0;
    while (i + 8 <= n) {
        uint64_t x, y;
        memcpy(&x, a + la - i - 8, 8);
        memcpy(&y, b + lb - i - 8, 8);
        if (x != y)
            break;
        i += 8;
    }
    while (i < n && a[la - i - 1] == b[lb - i - 1])
        i++;
    return i;
}

static PyObject *shared_ends(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer base, data;
    if (!PyArg_ParseTuple(args, "y*y*:shared_ends", &base, &data))
        return NULL;
    const unsigned char *a = base.buf, *b = data.buf;
    size_t la = (size_t)base.len, lb = (size_t)data.len, prefix, suffix;
    size_t limit = la < lb ? la : lb;
    Py_BEGIN_ALLOW_THREADS
    prefix = common_prefix(a, b, limit);
    suffix = common_suffix(a, la, b, lb, limit - prefix);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&base);
    PyBuffer_Release(&data);
    return Py_BuildValue("(nn)", (Py_ssize_t)prefix, (Py_ssize_t)suffix);
}

/* -- the copy/insert delta ------------------------------------------------------------ */

#define BLOCK 16 /* bytes hashed per base block: the shortest copy */
#define K1 0x9E3779B97F4A7C15ULL
#define K2 0xC2B2AE3D27D4EB4FULL

static uint64_t load64(const unsigned char *p) {
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

static size_t block_hash(const unsigned char *p, int bits) {
    return (size_t)((load64(p) * K1 ^ load64(p + 8) * K2) >> (64 - bits));
}

static unsigned char *put_op(unsigned char *out, size_t length, int copy, size_t offset) {
    out = put_varint(out, (length << 1) | (size_t)copy);
    return copy ? put_varint(out, offset) : out;
}

static unsigned char *put_literal(unsigned char *out, const unsigned char *from, size_t n) {
    if (!n)
        return out;
    out = put_op(out, n, 0, 0);
    memcpy(out, from, n);
    return out + n;
}

/* The delta into out (at least 3 * lb + 128 bytes); its length, or -1 if the table
 * could not be allocated. */
static Py_ssize_t copies(const unsigned char *a, size_t la, const unsigned char *b, size_t lb,
                         unsigned char *out) {
    unsigned char *o = out;
    size_t limit = la < lb ? la : lb;
    size_t prefix = common_prefix(a, b, limit);
    size_t suffix = common_suffix(a, la, b, lb, limit - prefix);
    size_t lo = prefix, hi = lb - suffix, literal = lo;
    if (prefix)
        o = put_op(o, prefix, 1, 0);
    if (hi - lo >= 2 * BLOCK && la >= BLOCK && la < UINT32_MAX) {
        size_t blocks = la / BLOCK;
        int bits = 4;
        while (((size_t)1 << bits) < 2 * blocks)
            bits++;
        uint32_t *table = calloc((size_t)1 << bits, sizeof(uint32_t));
        if (!table)
            return -1;
        for (size_t k = 0; k < blocks; k++) {
            size_t h = block_hash(a + k * BLOCK, bits);
            if (!table[h])
                table[h] = (uint32_t)(k * BLOCK + 1);
        }
        size_t pos = lo;
        while (pos + BLOCK <= hi) {
            uint32_t found = table[block_hash(b + pos, bits)];
            if (!found || memcmp(a + found - 1, b + pos, BLOCK) != 0) {
                pos++;
                continue;
            }
            size_t from = found - 1, to = pos;
            size_t n = common_prefix(a + from, b + to, (la - from) < (hi - to) ? la - from : hi - to);
            while (to > literal && from > 0 && b[to - 1] == a[from - 1]) {
                to--;
                from--;
                n++;
            }
            o = put_literal(o, b + literal, to - literal);
            o = put_op(o, n, 1, from);
            pos = literal = to + n;
        }
        free(table);
    }
    o = put_literal(o, b + literal, hi - literal);
    if (suffix)
        o = put_op(o, suffix, 1, la - suffix);
    return o - out;
}

static PyObject *copy_delta(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer base, data;
    if (!PyArg_ParseTuple(args, "y*y*:copy_delta", &base, &data))
        return NULL;
    PyObject *result = NULL;
    unsigned char *out = NULL;
    if ((size_t)data.len > (PY_SSIZE_T_MAX - 128) / 3) {
        PyErr_NoMemory();
        goto done;
    }
    out = malloc(3 * (size_t)data.len + 128);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = copies(base.buf, (size_t)base.len, data.buf, (size_t)data.len, out);
    Py_END_ALLOW_THREADS
    if (n < 0)
        PyErr_NoMemory();
    else
        result = PyBytes_FromStringAndSize((const char *)out, n);
    free(out);
done:
    PyBuffer_Release(&base);
    PyBuffer_Release(&data);
    return result;
}

/* Reads a varint at *at (below end); 0 if it is cut short or over 64 bits. */
static int get_varint(const unsigned char *d, size_t end, size_t *at, size_t *n) {
    size_t value = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        if (*at >= end)
            return 0;
        unsigned char byte = d[(*at)++];
        if (shift == 63 && (byte & 0x7E))
            return 0; /* past 64 bits */
        value |= (size_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *n = value;
            return 1;
        }
    }
    return 0;
}

/* NULL on success, else what is wrong with the delta. */
static const char *apply(const unsigned char *a, size_t la, const unsigned char *d, size_t ld,
                         unsigned char *out, size_t size) {
    size_t at = 0, made = 0, tag, offset;
    while (at < ld) {
        if (!get_varint(d, ld, &at, &tag))
            return "an operation is cut short";
        size_t n = tag >> 1;
        if (n == 0)
            return "an operation of no bytes";
        if (n > size - made)
            return "the operations make more bytes than the row says";
        if (tag & 1) {
            if (!get_varint(d, ld, &at, &offset))
                return "a copy is cut short";
            if (offset > la || n > la - offset)
                return "a copy reaches past the end of its base";
            memcpy(out + made, a + offset, n);
        } else {
            if (n > ld - at)
                return "an insert is cut short";
            memcpy(out + made, d + at, n);
            at += n;
        }
        made += n;
    }
    return made == size ? NULL : "the operations make fewer bytes than the row says";
}

static PyObject *apply_copies(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer base, delta;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "y*y*n:apply_copies", &base, &delta, &size))
        return NULL;
    PyObject *result = NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative size");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (!result)
        goto done;
    const char *wrong;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    wrong = apply(base.buf, (size_t)base.len, delta.buf, (size_t)delta.len, out, (size_t)size);
    Py_END_ALLOW_THREADS
    if (wrong) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, wrong);
    }
done:
    PyBuffer_Release(&base);
    PyBuffer_Release(&delta);
    return result;
}

/* untrack(objects): each of ``objects`` out of the cycle collector's lists. For the
   trees a checkpoint keeps (trees.py, TreeReader): a folder's tree is a dict of entries
   that hold only strings and numbers, so it can be in no reference cycle, yet each young
   collection traversed every entry of every tree kept since the last one (35 ms of a
   checkpoint's turn under the eight-session load, finding nothing). Only for objects
   that can reach no cycle: an untracked object in one would never be collected. A dict
   tracks itself again when a tracked object is put into it. */
static PyObject *untrack(PyObject *self, PyObject *objects) {
    PyObject *it = PyObject_GetIter(objects);
    if (!it)
        return NULL;
    PyObject *obj;
    while ((obj = PyIter_Next(it))) {
        if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj))
            PyObject_GC_UnTrack(obj);
        Py_DECREF(obj);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}


/* -- content-defined chunking (daemon/capture/chunks.py, its Python twin) -------------- */

/* FastCDC's gear hash: h = (h << 1) + GEAR[byte], so bit k of h depends on the last
 * k + 1 bytes; a cut is tested on the top bits (the widest window). The table comes from
 * splitmix64 seeded with 0, which the twin computes the same way. */
static uint64_t GEAR[256];

static void gear_init(void) {
    uint64_t x = 0;
    for (int i = 0; i < 256; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        GEAR[i] = z ^ (z >> 31);
    }
}

static uint64_t top_mask(int bits) { return bits <= 0 ? 0 : (~0ULL) << (64 - bits); }

/* Looks for a cut in p[*at..end) under mask, h carried in *hash: the cut (the bytes up
 * to it), or 0 with *at and *hash where it stopped. Two bytes a step: h two bytes on is
 * (h << 2) + (GEAR[a] << 1) + GEAR[b], whose sum of table entries does not wait for h
 * (one shift and one add on the chain per two bytes, not two of each); h after the
 * first byte is tested on the side. The cuts are those of one byte a step. */
static inline size_t gear_scan(const unsigned char *p, size_t *at, size_t end,
                               uint64_t *hash, uint64_t mask) {
    size_t i = *at;
    uint64_t h = *hash;
    for (; i + 1 < end; i += 2) {
        uint64_t a = GEAR[p[i]], pair = (a << 1) + GEAR[p[i + 1]];
        if (!(((h << 1) + a) & mask))
            return i + 1;
        h = (h << 2) + pair;
        if (!(h & mask))
            return i + 2;
    }
    for (; i < end; i++) {
        h = (h << 1) + GEAR[p[i]];
        if (!(h & mask))
            return i + 1;
    }
    *at = i;
    *hash = h;
    return 0;
}

/* The length of the chunk starting at p (n bytes available, n <= max): no cut before
 * min, the harder mask up to avg (normalized chunking), the easier one after. */
static size_t cdc_cut(const unsigned char *p, size_t n, size_t min, size_t avg,
                      uint64_t mask_s, uint64_t mask_l) {
    if (n <= min)
        return n;
    size_t i = min, cut;
    uint64_t h = 0;
    if ((cut = gear_scan(p, &i, avg < n ? avg : n, &h, mask_s)) != 0)
        return cut;
    if ((cut = gear_scan(p, &i, n, &h, mask_l)) != 0)
        return cut;
    return n;
}

static PyObject *cdc_cuts(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    Py_ssize_t min, avg, max;
    int bits, last;
    if (!PyArg_ParseTuple(args, "y*nnnip:cdc_cuts", &data, &min, &avg, &max, &bits, &last))
        return NULL;
    if (min < 0 || avg < min || max < avg || max < 1 || bits < 2 || bits > 62) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "cdc_cuts: bad sizes");
        return NULL;
    }
    const unsigned char *p = data.buf;
    size_t len = (size_t)data.len, at = 0, count = 0, cap = len / (size_t)(min > 0 ? min : 1) + 2;
    size_t *ends = PyMem_RawMalloc(cap * sizeof(size_t));
    if (ends == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    uint64_t mask_s = top_mask(bits + 1), mask_l = top_mask(bits - 1);
    Py_BEGIN_ALLOW_THREADS
    while (at < len) {
        size_t rest = len - at;
        if (!last && rest < (size_t)max)
            break; /* the next bytes may move this cut: the caller reads on */
        size_t n = cdc_cut(p + at, rest < (size_t)max ? rest : (size_t)max,
                           (size_t)min, (size_t)avg, mask_s, mask_l);
        at += n;
        if (count == cap)
            break; /* cannot happen: every chunk but the last is at least min long */
        ends[count++] = at;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *out = PyList_New((Py_ssize_t)count);
    if (out == NULL) {
        PyMem_RawFree(ends);
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        PyObject *v = PyLong_FromSize_t(ends[i]);
        if (v == NULL) {
            PyMem_RawFree(ends);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    PyMem_RawFree(ends);
    return out;
}

static PyMethodDef methods[] = {
    {"cdc_cuts", cdc_cuts, METH_VARARGS,
     "cdc_cuts(data, min, avg, max, bits, last) -> [end, ...]"},
    {"untrack", untrack, METH_O, "untrack(objects) -> None"},
    {"copy_delta", copy_delta, METH_VARARGS, "copy_delta(base, data) -> bytes"},
    {"apply_copies", apply_copies, METH_VARARGS, "apply_copies(base, delta, size) -> bytes"},
    {"pack_hex", pack_hex, METH_O, "pack_hex(data) -> bytes"},
    {"unpack_hex", unpack_hex, METH_O, "unpack_hex(packed) -> bytes"},
    {"encode_tree", encode_tree, METH_VARARGS, "encode_tree(items, codes) -> bytes"},
    {"shared_ends", shared_ends, METH_VARARGS, "shared_ends(base, data) -> (prefix, suffix)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_codec",
    "The hot path's encodings (packs.py, trees.py) and chunker (capture/chunks.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__codec(void) {
    gear_init();
    return PyModule_Create(&module);
}
