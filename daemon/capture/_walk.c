/* worldline.daemon._walk: one pass over a folder tree, for full scans.
 *
 * walk(root_fd, inotify_fd, mask, max_depth, overlay, caches, root_sig[, prefix[, max_entries]])
 *     -> (records, reused, root, listed)
 *
 * The pure-Python twin, the contract and the tests that hold both to it are in
 * daemon/capture/walk.py and tests/test_walk.py; this file does the same work without an
 * interpreter round trip per entry. Every folder is opened with O_NOFOLLOW relative to
 * its parent's descriptor, watched (when inotify_fd >= 0) through /proc/self/fd before
 * it is listed, then listed with one fstatat(AT_SYMLINK_NOFOLLOW) per entry.
 *
 * Two phases. Phase 1, without the GIL, is the system calls: one thread per core (at
 * most 4) takes folders from a shared stack, opens, watches and lists them, and pushes
 * their subfolders; a folder's descriptor stays open until its last subfolder is
 * opened. Phase 2, with the GIL, walks the finished tree children first, checks the
 * memos and builds the Python objects, so the output never depends on thread timing.
 *
 * caches() returns (files, folders); it is called once the system calls are done, so
 * the stat cache may load meanwhile. files is the stat cache (path -> (signature,
 * ref, extra, kind)), folders the folder memos (path -> (signature, tree digest, size,
 * kind, extra));
 * paths start at prefix. A signature is the 56 bytes of struct.pack("=qqqQIIIIq", size,
 * mtime_ns, ctime_ns, ino, mode, uid, gid, nlink, blocks). A memo (a 5-tuple) holds
 * when the folder's own signature is the memo's, every file and symlink in it matches
 * the stat cache, every folder in it is held by its memo, no file in it has another
 * hard link, and it holds nothing but files, folders and symlinks. Such a folder gives no
 * record: it is listed in reused as (relpath, wd, names), names counting every name in
 * it and below it, and its parent's entry carries the memo.
 *
 * A record is (relpath, wd, opaque, entries), children before their parent. An entry
 * is (name, signature, extra): extra is the child's record index or memo for a folder,
 * the target for a symlink, st_rdev for a device, None otherwise. root is the root's
 * record index or memo. wd is the watch descriptor, minus the errno when the watch
 * could not be added, 0 when not watching. An entry that vanishes while it is read is
 * left out (as os.scandir would); any other failure raises OSError; a folder deeper
 * than max_depth raises RecursionError naming it. listed counts every name listed
 * (in folders whose memo holds too); past max_entries the walk stops, its threads'
 * listings cut short, and raises TooManyEntries((relpath, listed)): what it holds in
 * memory stays within the limit (one thread's folder may overshoot by what the others
 * listed meanwhile).
 */
#define _GNU_SOURCE /* struct dirent64 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <pthread.h>
#include <unistd.h>

#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define SIG_LEN 56 /* a signature's bytes */

typedef struct {
    mode_t st_mode;
    off_t st_size;
    long long mtime_ns, ctime_ns;
    ino_t st_ino;
    dev_t st_rdev;
    uid_t st_uid;
    gid_t st_gid;
    nlink_t st_nlink;
    blkcnt_t st_blocks;
} meta_t;

typedef struct {
    size_t name;     /* offset of the NUL-terminated name in the buffer */
    size_t target;   /* offset of a symlink's target, when is_link */
    size_t target_len;
    int is_link;
    meta_t st; /* what a signature needs of struct stat, a third of its size */
} item_t;

typedef struct {
    item_t *items;
    size_t n, cap;
    char *buf;
    size_t used, size;
    int err;          /* errno of a failure that aborts the walk, 0 if none */
} listing_t;

#define TOO_DEEP (-1)  /* walk_t.err: a folder deeper than max_depth */
#define TOO_MANY (-2)  /* walk_t.err and listing_t.err: more names than max_entries */

static PyObject *TooManyEntries; /* the exception */

typedef struct node node_t;

/* One folder of the tree, filled in by phase 1 (without the GIL). */
struct node {
    node_t *parent;
    char *rel;        /* path from the workspace root */
    const char *name; /* its last component, inside rel */
    int depth;
    int fd;           /* open while it is listed and while a child folder waits to open */
    int pending;      /* child folders not opened yet */
    int wd, opaque, vanished;
    size_t below;     /* names in it and below it (phase 2) */
    char sig[SIG_LEN]; /* its own signature, from its parent's listing (the root's: given) */
    listing_t l;
    node_t **kids;    /* per listed item: the child folder's node, or NULL */
    node_t *next_all; /* every node, for freeing */
};

typedef struct {
    /* phase 1: shared by the workers, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    node_t **stack;
    size_t depth_of_stack, cap;
    size_t outstanding; /* nodes pushed and not yet processed */
    node_t *all;
    int root_fd;
    int err;            /* first failure: an errno, TOO_DEEP or TOO_MANY */
    char *err_rel;
    size_t listed;      /* names listed so far */
    /* read-only settings */
    int inotify_fd;
    uint32_t mask;
    int max_depth;
    size_t max_entries;
    int overlay;
    /* phase 2, with the GIL */
    PyObject *records; /* folders whose memo does not hold, children first */
    PyObject *reused;  /* (relpath, wd) of folders whose memo holds */
    PyObject *files;   /* path -> (signature, digest): the stat cache */
    PyObject *folders; /* path -> (signature, tree digest, size, kind): folder memos */
} walk_t;

static int reserve(listing_t *l, size_t extra) {
    if (l->used + extra <= l->size)
        return 0;
    size_t size = l->size ? l->size : 256; /* most folders hold a few names */
    while (l->used + extra > size)
        size *= 2;
    char *buf = realloc(l->buf, size);
    if (buf == NULL)
        return -1;
    l->buf = buf;
    l->size = size;
    return 0;
}

static item_t *push_item(listing_t *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        item_t *items = realloc(l->items, cap * sizeof(item_t));
        if (items == NULL)
            return NULL;
        l->items = items;
        l->cap = cap;
    }
    return &l->items[l->n++];
}

/* Runs without the GIL: watch, then list the folder open at dfd, stopping (TOO_MANY)
 * past limit names. */
static void list_folder(int dfd, int rewind, const walk_t *w, size_t limit, listing_t *l,
                        int *wd, int *opaque) {
    *wd = 0;
    *opaque = 0;
    if (w->inotify_fd >= 0) {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
        int r = inotify_add_watch(w->inotify_fd, proc, w->mask);
        *wd = r < 0 ? -errno : r;
    }
    if (w->overlay) {
        char value[2];
        ssize_t n = fgetxattr(dfd, "trusted.overlay.opaque", value, sizeof value);
        *opaque = n == 1 && value[0] == 'y';
    }
    if (rewind && lseek(dfd, 0, SEEK_SET) < 0) { /* the caller's descriptor */
        l->err = errno;
        return;
    }
    /* getdents64 straight on the folder's descriptor: no dup, no DIR, no allocation */
    char dents[32768];
    long got = 0, at = 0;
    for (;;) {
        if (at >= got) {
            got = syscall(SYS_getdents64, dfd, dents, sizeof dents);
            at = 0;
            if (got < 0) {
                l->err = errno;
                break;
            }
            if (got == 0)
                break;
        }
        struct dirent64 *de = (struct dirent64 *)(dents + at);
        at += de->d_reclen;
        const char *name = de->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))
            continue;
        size_t len = strlen(name);
        if (l->n >= limit) {
            l->err = TOO_MANY;
            break;
        }
        item_t *it = push_item(l);
        if (it == NULL || reserve(l, len + 1) < 0) {
            l->err = ENOMEM;
            break;
        }
        struct stat full;
        if (fstatat(dfd, name, &full, AT_SYMLINK_NOFOLLOW) < 0) {
            l->n--;
            if (errno == ENOENT)
                continue; /* removed while we looked */
            l->err = errno;
            break;
        }
        it->st.st_mode = full.st_mode;
        it->st.st_size = full.st_size;
        it->st.mtime_ns = (long long)full.st_mtim.tv_sec * 1000000000LL + full.st_mtim.tv_nsec;
        it->st.ctime_ns = (long long)full.st_ctim.tv_sec * 1000000000LL + full.st_ctim.tv_nsec;
        it->st.st_ino = full.st_ino;
        it->st.st_rdev = full.st_rdev;
        it->st.st_uid = full.st_uid;
        it->st.st_gid = full.st_gid;
        it->st.st_nlink = full.st_nlink;
        it->st.st_blocks = full.st_blocks;
        it->name = l->used;
        memcpy(l->buf + l->used, name, len + 1);
        l->used += len + 1;
        it->is_link = S_ISLNK(it->st.st_mode);
        if (it->is_link) {
            size_t cap = (size_t)it->st.st_size + 1;
            if (cap < 256)
                cap = 256;
            for (;;) {
                if (reserve(l, cap) < 0) {
                    l->err = ENOMEM;
                    break;
                }
                /* name is re-read from the buffer: reserve may have moved it */
                ssize_t n = readlinkat(dfd, l->buf + it->name, l->buf + l->used, cap);
                if (n < 0) {
                    if (errno == ENOENT) {
                        l->n--;
                    } else {
                        l->err = errno;
                    }
                    break;
                }
                if ((size_t)n < cap) {
                    it->target = l->used;
                    it->target_len = (size_t)n;
                    l->used += (size_t)n;
                    break;
                }
                cap *= 2; /* the link grew between fstatat and readlinkat */
            }
            if (l->err)
                break;
        }
    }
}

/* The 56 bytes of struct.pack("=qqqQIIIIq", size, mtime_ns, ctime_ns, ino, mode, uid,
 * gid, nlink, blocks). */
static void signature(const meta_t *st, char out[SIG_LEN]) {
    long long size = (long long)st->st_size;
    long long mtime = st->mtime_ns;
    long long ctime = st->ctime_ns;
    unsigned long long ino = (unsigned long long)st->st_ino;
    unsigned int mode = (unsigned int)st->st_mode;
    unsigned int uid = (unsigned int)st->st_uid;
    unsigned int gid = (unsigned int)st->st_gid;
    unsigned int nlink = (unsigned int)st->st_nlink;
    long long blocks = (long long)st->st_blocks;
    memcpy(out, &size, 8);
    memcpy(out + 8, &mtime, 8);
    memcpy(out + 16, &ctime, 8);
    memcpy(out + 24, &ino, 8);
    memcpy(out + 32, &mode, 4);
    memcpy(out + 36, &uid, 4);
    memcpy(out + 40, &gid, 4);
    memcpy(out + 44, &nlink, 4);
    memcpy(out + 48, &blocks, 8);
}

static void os_error(int err, const char *rel) {
    errno = err;
    PyObject *path = PyUnicode_DecodeFSDefault(*rel ? rel : ".");
    if (path != NULL) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        Py_DECREF(path);
    }
}

static char *join(const char *rel, const char *name) {
    size_t a = strlen(rel), b = strlen(name);
    char *out = malloc(a + b + 2);
    if (out == NULL)
        return NULL;
    if (a) {
        memcpy(out, rel, a);
        out[a++] = '/';
    }
    memcpy(out + a, name, b + 1);
    return out;
}

/* 1 when files[path] is (signature, digest) with this signature, 0 if not, -1 on error. */
static int file_matches(walk_t *w, const char *path, const char sig[SIG_LEN]) {
    PyObject *key = PyUnicode_DecodeFSDefault(path);
    if (key == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(w->files, key);
    Py_DECREF(key);
    if (known == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) < 1)
        return 0;
    PyObject *s = PyTuple_GET_ITEM(known, 0);
    return PyBytes_Check(s) && PyBytes_GET_SIZE(s) == SIG_LEN &&
           memcmp(PyBytes_AS_STRING(s), sig, SIG_LEN) == 0;
}

/* Phase 1: a few threads open, watch and list folders from a shared stack. */

static void fail_locked(walk_t *w, int err, const char *rel) {
    if (w->err == 0) {
        w->err = err;
        w->err_rel = strdup(rel);
    }
}

static node_t *new_node(walk_t *w, node_t *parent, const char *name, const char *sig) {
    node_t *n = calloc(1, sizeof *n);
    if (n == NULL)
        return NULL;
    n->rel = parent ? join(parent->rel, name) : strdup(name);
    if (n->rel == NULL) {
        free(n);
        return NULL;
    }
    n->name = n->rel + (parent && *parent->rel ? strlen(parent->rel) + 1 : 0);
    n->parent = parent;
    n->depth = parent ? parent->depth + 1 : 0;
    n->fd = -1;
    memcpy(n->sig, sig, SIG_LEN);
    n->next_all = w->all; /* under mu */
    w->all = n;
    return n;
}

/* A child of parent was opened (or failed to): close the parent once none waits. */
static void release_parent_locked(node_t *parent) {
    if (--parent->pending == 0 && parent->parent != NULL && parent->fd >= 0) {
        close(parent->fd);
        parent->fd = -1;
    }
}

static void process(walk_t *w, node_t *n) {
    int err = 0;
    if (n->depth > w->max_depth) {
        pthread_mutex_lock(&w->mu);
        fail_locked(w, TOO_DEEP, n->rel);
        if (n->parent)
            release_parent_locked(n->parent);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    if (n->parent) {
        n->fd = openat(n->parent->fd, n->name, DIR_FLAGS);
        err = n->fd < 0 ? errno : 0;
        pthread_mutex_lock(&w->mu);
        release_parent_locked(n->parent);
        pthread_mutex_unlock(&w->mu);
        if (err == ENOENT || err == ENOTDIR || err == ELOOP) {
            n->vanished = 1; /* removed, or swapped for a file or symlink, while we looked */
            return;
        }
    } else {
        n->fd = w->root_fd;
    }
    if (!err) {
        pthread_mutex_lock(&w->mu);
        size_t limit = w->listed < w->max_entries ? w->max_entries - w->listed : 0;
        pthread_mutex_unlock(&w->mu);
        list_folder(n->fd, n->parent == NULL, w, limit, &n->l, &n->wd, &n->opaque);
        err = n->l.err;
    }
    size_t dirs = 0;
    if (!err) {
        for (size_t i = 0; i < n->l.n; i++)
            dirs += S_ISDIR(n->l.items[i].st.st_mode);
        n->kids = calloc(n->l.n ? n->l.n : 1, sizeof(node_t *));
        if (n->kids == NULL)
            err = ENOMEM;
    }
    pthread_mutex_lock(&w->mu);
    w->listed += n->l.n;
    if (!err && w->listed > w->max_entries)
        err = TOO_MANY; /* others listed meanwhile */
    if (err) {
        fail_locked(w, err, n->rel);
        dirs = 0;
    }
    if (dirs && w->depth_of_stack + dirs > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (w->depth_of_stack + dirs > cap)
            cap *= 2;
        node_t **stack = realloc(w->stack, cap * sizeof(node_t *));
        if (stack == NULL) {
            fail_locked(w, ENOMEM, n->rel);
            dirs = 0;
        } else {
            w->stack = stack;
            w->cap = cap;
        }
    }
    n->pending = (int)dirs;
    /* pushed last first, so the first folder is listed first: depth first, few open */
    for (size_t i = n->l.n; dirs && i-- > 0;) {
        item_t *it = &n->l.items[i];
        if (!S_ISDIR(it->st.st_mode))
            continue;
        char sig[SIG_LEN];
        signature(&it->st, sig);
        node_t *kid = new_node(w, n, n->l.buf + it->name, sig);
        if (kid == NULL) {
            fail_locked(w, ENOMEM, n->rel);
            n->pending -= 1;
            continue;
        }
        n->kids[i] = kid;
        w->stack[w->depth_of_stack++] = kid;
        w->outstanding++;
    }
    if (n->pending == 0 && n->parent != NULL && n->fd >= 0) {
        close(n->fd);
        n->fd = -1;
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void *worker(void *arg) {
    walk_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->depth_of_stack == 0 && w->outstanding > 0 && w->err == 0)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->depth_of_stack == 0 || w->err != 0)
            break;
        node_t *n = w->stack[--w->depth_of_stack];
        pthread_mutex_unlock(&w->mu);
        process(w, n);
        pthread_mutex_lock(&w->mu);
        w->outstanding--;
        if (w->outstanding == 0)
            pthread_cond_broadcast(&w->cv);
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int thread_count(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 1 ? 1 : cpus > 4 ? 4 : (int)cpus;
}

/* Phase 2, with the GIL: records and memos, children before their parent. Returns a new
 * reference: the folder's record index (int) or its memo (tuple); NULL on error. */
static PyObject *build(walk_t *w, node_t *n) {
    PyObject *result = NULL, *children = NULL, *rel_obj = NULL;
    char (*sigs)[SIG_LEN] = NULL;
    listing_t *l = &n->l;
    rel_obj = PyUnicode_DecodeFSDefault(n->rel);
    children = PyList_New((Py_ssize_t)l->n); /* per item: a folder's result, else None */
    sigs = malloc((l->n ? l->n : 1) * SIG_LEN);
    if (rel_obj == NULL || children == NULL || sigs == NULL) {
        if (sigs == NULL)
            PyErr_NoMemory();
        goto done;
    }
    PyObject *memo = PyDict_GetItemWithError(w->folders, rel_obj); /* borrowed */
    if (memo == NULL && PyErr_Occurred())
        goto done;
    int reusable = memo != NULL && PyTuple_Check(memo) && PyTuple_GET_SIZE(memo) == 5 &&
                   PyBytes_Check(PyTuple_GET_ITEM(memo, 0)) &&
                   PyBytes_GET_SIZE(PyTuple_GET_ITEM(memo, 0)) == SIG_LEN &&
                   memcmp(PyBytes_AS_STRING(PyTuple_GET_ITEM(memo, 0)), n->sig, SIG_LEN) == 0;
    for (size_t i = 0; i < l->n; i++) {
        item_t *it = &l->items[i];
        signature(&it->st, sigs[i]);
        PyObject *child = NULL;
        if (S_ISDIR(it->st.st_mode)) {
            node_t *kid = n->kids[i];
            if (kid == NULL || kid->vanished) {
                it->name = (size_t)-1; /* removed while we looked */
                reusable = 0;
                child = Py_NewRef(Py_None);
            } else {
                child = build(w, kid);
                if (child == NULL)
                    goto done;
                if (!PyTuple_Check(child))
                    reusable = 0; /* the child folder changed */
                n->below += kid->below;
            }
        } else if (S_ISREG(it->st.st_mode) || it->is_link) {
            if (S_ISREG(it->st.st_mode) && it->st.st_nlink > 1)
                reusable = 0; /* a hard link may change through a name outside the folder */
            if (reusable) {
                char *path = join(n->rel, l->buf + it->name);
                if (path == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                int m = file_matches(w, path, sigs[i]);
                free(path);
                if (m < 0)
                    goto done;
                reusable = m;
            }
        } else {
            reusable = 0; /* anything but files, folders and symlinks is looked at again */
        }
        PyList_SET_ITEM(children, (Py_ssize_t)i, child ? child : Py_NewRef(Py_None));
    }
    n->below += l->n;
    if (reusable) {
        PyObject *pair = Py_BuildValue("(Oin)", rel_obj, n->wd, (Py_ssize_t)n->below);
        if (pair == NULL || PyList_Append(w->reused, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
        result = Py_NewRef(memo);
        goto done;
    }
    PyObject *entries = PyList_New(0);
    if (entries == NULL)
        goto done;
    for (size_t i = 0; i < l->n; i++) {
        item_t *it = &l->items[i];
        if (it->name == (size_t)-1)
            continue;
        PyObject *extra = PyList_GET_ITEM(children, (Py_ssize_t)i);
        if (it->is_link)
            extra = PyUnicode_DecodeFSDefaultAndSize(l->buf + it->target,
                                                     (Py_ssize_t)it->target_len);
        else if (S_ISCHR(it->st.st_mode) || S_ISBLK(it->st.st_mode))
            extra = PyLong_FromUnsignedLongLong((unsigned long long)it->st.st_rdev);
        else
            Py_INCREF(extra);
        PyObject *entry = extra == NULL ? NULL : Py_BuildValue(
            "(Ny#N)", PyUnicode_DecodeFSDefault(l->buf + it->name), sigs[i],
            (Py_ssize_t)SIG_LEN, extra);
        if (entry == NULL || PyList_Append(entries, entry) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(entries);
            goto done;
        }
        Py_DECREF(entry);
    }
    PyObject *record = Py_BuildValue("(OiON)", rel_obj, n->wd, n->opaque ? Py_True : Py_False,
                                     entries);
    if (record == NULL || PyList_Append(w->records, record) < 0) {
        Py_XDECREF(record);
        goto done;
    }
    Py_DECREF(record);
    result = PyLong_FromSsize_t(PyList_GET_SIZE(w->records) - 1);
done:
    Py_XDECREF(children);
    Py_XDECREF(rel_obj);
    free(sigs);
    return result;
}

static void free_nodes(walk_t *w) {
    node_t *n = w->all;
    while (n != NULL) {
        node_t *next = n->next_all;
        if (n->parent != NULL && n->fd >= 0)
            close(n->fd); /* left open by a walk that stopped early */
        free(n->l.items);
        free(n->l.buf);
        free(n->kids);
        free(n->rel);
        free(n);
        n = next;
    }
    w->all = NULL;
    free(w->stack);
    free(w->err_rel);
}

static PyObject *walk(PyObject *Py_UNUSED(self), PyObject *args) {
    walk_t w;
    memset(&w, 0, sizeof w);
    unsigned int mask;
    const char *root_sig;
    Py_ssize_t root_sig_len;
    PyObject *prefix = NULL; /* bytes, from the optional str */
    PyObject *caches;
    Py_ssize_t max_entries = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "iiIipOy#|O&n", &w.root_fd, &w.inotify_fd, &mask,
                          &w.max_depth, &w.overlay, &caches, &root_sig, &root_sig_len,
                          PyUnicode_FSConverter, &prefix, &max_entries))
        return NULL;
    if (max_entries < 0) {
        Py_XDECREF(prefix);
        PyErr_SetString(PyExc_ValueError, "max_entries must not be negative");
        return NULL;
    }
    w.max_entries = (size_t)max_entries;
    if (!PyCallable_Check(caches)) {
        Py_XDECREF(prefix);
        PyErr_SetString(PyExc_TypeError, "caches must be callable");
        return NULL;
    }
    if (root_sig_len != SIG_LEN) {
        Py_XDECREF(prefix);
        PyErr_SetString(PyExc_ValueError, "the root signature must be 56 bytes");
        return NULL;
    }
    w.mask = mask;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    node_t *root = new_node(&w, NULL, prefix ? PyBytes_AS_STRING(prefix) : "", root_sig);
    Py_XDECREF(prefix);
    PyObject *result = NULL, *pair = NULL;
    if (root == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    w.stack = malloc(256 * sizeof(node_t *));
    if (w.stack == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    w.cap = 256;
    w.stack[w.depth_of_stack++] = root;
    w.outstanding = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_t threads[4];
    int started = 0, wanted = thread_count() - 1;
    for (int i = 0; i < wanted; i++)
        if (pthread_create(&threads[started], NULL, worker, &w) == 0)
            started++;
    worker(&w);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    Py_END_ALLOW_THREADS
    if (w.err == TOO_DEEP) {
        PyObject *path = PyUnicode_DecodeFSDefault(w.err_rel ? w.err_rel : "");
        if (path != NULL) {
            PyErr_SetObject(PyExc_RecursionError, path);
            Py_DECREF(path);
        }
        goto out;
    }
    if (w.err == TOO_MANY) {
        PyObject *info = Py_BuildValue("(Nn)", PyUnicode_DecodeFSDefault(
            w.err_rel ? w.err_rel : ""), (Py_ssize_t)w.listed);
        if (info != NULL) {
            PyErr_SetObject(TooManyEntries, info);
            Py_DECREF(info);
        }
        goto out;
    }
    if (w.err == ENOMEM) {
        PyErr_NoMemory();
        goto out;
    }
    if (w.err != 0) {
        os_error(w.err, w.err_rel ? w.err_rel : "");
        goto out;
    }
    /* the caches are asked for only now: they may have been loading meanwhile */
    pair = PyObject_CallNoArgs(caches);
    if (pair == NULL)
        goto out;
    if (!PyArg_ParseTuple(pair, "O!O!;caches() must return (files, folders)", &PyDict_Type,
                          &w.files, &PyDict_Type, &w.folders))
        goto out;
    w.records = PyList_New(0);
    w.reused = PyList_New(0);
    if (w.records == NULL || w.reused == NULL)
        goto out;
    PyObject *top = build(&w, root);
    if (top == NULL)
        goto out;
    result = Py_BuildValue("(OONn)", w.records, w.reused, top, (Py_ssize_t)w.listed);
out:
    Py_XDECREF(pair);
    Py_XDECREF(w.records);
    Py_XDECREF(w.reused);
    free_nodes(&w);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(root_fd, inotify_fd, mask, max_depth, overlay, caches, root_sig[, prefix"
     "[, max_entries]]) -> (records, reused, root, listed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_walk", "One pass over a folder tree, for full scans.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__walk(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    TooManyEntries = PyErr_NewExceptionWithDoc(
        "worldline.daemon.capture._walk.TooManyEntries",
        "The walk listed more names than max_entries; args: (relpath, listed).",
        NULL, NULL);
    if (TooManyEntries == NULL || PyModule_AddObjectRef(m, "TooManyEntries",
                                                        TooManyEntries) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
