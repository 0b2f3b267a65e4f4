/* Weei model SDK: memory, JSON, operations, progress. See weei_sdk.h. */
#include "weei_sdk.h"

/* ---- memory ---------------------------------------------------------------
 * Linear memory is addressed by 32-bit offsets. The heap is a list of blocks,
 * each with an 8-byte header {size incl. header, tag}; free blocks sit in an
 * address-ordered list (next offset stored in the payload) and coalesce with
 * their neighbours, and a free block at the top of the heap is given back to
 * the bump pointer. Allocation is first fit, then bump, then memory.grow.
 */

#if defined(__wasm__)
extern unsigned char __heap_base;
void *weei_addr(uint32_t off) { return (void *)(uintptr_t)off; }
uint32_t weei_off(const void *p) { return (uint32_t)(uintptr_t)p; }
uint64_t weei_memory_bytes(void) { return (uint64_t)__builtin_wasm_memory_size(0) * 65536u; }
#ifdef WEEI_HEAP_FLOOR
/* A module built with -DWEEI_HEAP_FLOOR=fn keeps the heap above fn()'s offset:
 * the ONNX graph runtime (c/onnx) reads a graph that its importer appended as a
 * data segment past the compiled memory (docs/onnx.md). Other models do not set it. */
uint32_t WEEI_HEAP_FLOOR(void);
static uint32_t heap_base_offset(void) {
    uint32_t base = (uint32_t)(uintptr_t)&__heap_base, floor = WEEI_HEAP_FLOOR();
    return floor > base ? floor : base;
}
#else
static uint32_t heap_base_offset(void) { return (uint32_t)(uintptr_t)&__heap_base; }
#endif
static int grow_memory_to(uint64_t end) {
    uint64_t have = weei_memory_bytes();
    if (end <= have) return 0;
    if (end > 0xFFFF0000ull) return -1;
    uint64_t pages = (end - have + 65535u) / 65536u;
    if (__builtin_wasm_memory_grow(0, (size_t)pages) == (size_t)-1) return -1;
    return 0;
}
#else
#ifndef WEEI_NATIVE_ARENA_BYTES
#define WEEI_NATIVE_ARENA_BYTES (512u << 20)
#endif
static uint8_t weei_arena[WEEI_NATIVE_ARENA_BYTES] __attribute__((aligned(64)));
void *weei_addr(uint32_t off) { return weei_arena + off; }
uint32_t weei_off(const void *p) { return (uint32_t)((const uint8_t *)p - weei_arena); }
uint64_t weei_memory_bytes(void) { return WEEI_NATIVE_ARENA_BYTES; }
static uint32_t heap_base_offset(void) { return 64; }
static int grow_memory_to(uint64_t end) { return end <= WEEI_NATIVE_ARENA_BYTES ? 0 : -1; }
#endif

#define TAG_USED 0x55534544u
#define TAG_FREE 0x46524545u
#define HDR 8u
#define MIN_BLOCK 16u

typedef struct { uint32_t size, tag; } block_hdr;

static uint32_t heap_start, heap_top, free_head;

static block_hdr *blk(uint32_t off) { return (block_hdr *)weei_addr(off); }
static uint32_t *blk_next(uint32_t off) { return (uint32_t *)weei_addr(off + HDR); }

static void heap_init(void) {
    if (heap_start) return;
    heap_start = (heap_base_offset() + 15u) & ~15u;
    heap_top = heap_start;
    free_head = 0;
}

uint32_t weei_alloc_export(uint32_t bytes) {
    heap_init();
    if (bytes > 0x7FFFFFF0u) return 0;
    uint32_t need = ((bytes + 7u) & ~7u) + HDR;
    if (need < MIN_BLOCK) need = MIN_BLOCK;
    uint32_t prev = 0, cur = free_head;
    while (cur) {
        block_hdr *h = blk(cur);
        if (h->size >= need) {
            uint32_t next = *blk_next(cur);
            uint32_t replacement = next;
            if (h->size - need >= 2 * MIN_BLOCK) {
                uint32_t rest = cur + need;
                blk(rest)->size = h->size - need;
                blk(rest)->tag = TAG_FREE;
                *blk_next(rest) = next;
                replacement = rest;
                h->size = need;
            }
            if (prev) *blk_next(prev) = replacement; else free_head = replacement;
            h->tag = TAG_USED;
            return cur + HDR;
        }
        prev = cur;
        cur = *blk_next(cur);
    }
    uint64_t end = (uint64_t)heap_top + need;
    if (grow_memory_to(end) != 0) return 0;
    uint32_t off = heap_top;
    heap_top = (uint32_t)end;
    blk(off)->size = need;
    blk(off)->tag = TAG_USED;
    return off + HDR;
}

void weei_free_export(uint32_t ptr) {
    if (!ptr || !heap_start) return;
    if (ptr < heap_start + HDR || ptr >= heap_top || (ptr & 7u)) return;
    uint32_t off = ptr - HDR;
    block_hdr *h = blk(off);
    if (h->tag != TAG_USED || h->size < MIN_BLOCK || (uint64_t)off + h->size > heap_top) return;
    h->tag = TAG_FREE;
    if (off + h->size == heap_top) {
        heap_top = off;
        /* The highest free block may now touch the top too: give it back. */
        uint32_t prev = 0, cur = free_head;
        while (cur && *blk_next(cur)) { prev = cur; cur = *blk_next(cur); }
        if (cur && cur + blk(cur)->size == heap_top) {
            heap_top = cur;
            if (prev) *blk_next(prev) = 0; else free_head = 0;
        }
        return;
    }
    uint32_t prev = 0, cur = free_head;
    while (cur && cur < off) { prev = cur; cur = *blk_next(cur); }
    *blk_next(off) = cur;
    if (prev) *blk_next(prev) = off; else free_head = off;
    if (cur && off + h->size == cur) { /* merge with the next block */
        h->size += blk(cur)->size;
        *blk_next(off) = *blk_next(cur);
    }
    if (prev && prev + blk(prev)->size == off) { /* merge into the previous block */
        blk(prev)->size += h->size;
        *blk_next(prev) = *blk_next(off);
    }
}

void *weei_malloc(size_t bytes) {
    if (bytes > 0x7FFFFFF0u) return NULL;
    uint32_t off = weei_alloc_export((uint32_t)bytes);
    return off ? weei_addr(off) : NULL;
}

void *weei_calloc(size_t bytes) {
    void *p = weei_malloc(bytes);
    if (p) weei_memzero(p, bytes);
    return p;
}

void weei_mfree(void *p) {
    if (p) weei_free_export(weei_off(p));
}

void *weei_realloc(void *p, size_t bytes) {
    if (!p) return weei_malloc(bytes);
    uint32_t have = blk(weei_off(p) - HDR)->size - HDR;
    if (bytes <= have) return p;
    void *q = weei_malloc(bytes);
    if (!q) return NULL;
    weei_memcopy(q, p, have);
    weei_mfree(p);
    return q;
}

void weei_memzero(void *dst, size_t n) { __builtin_memset(dst, 0, n); }
void weei_memcopy(void *dst, const void *src, size_t n) { __builtin_memcpy(dst, src, n); }

#if defined(__wasm__)
/* No libc: the compiler may still emit calls to these. With -mbulk-memory
 * the builtins lower to memory.fill / memory.copy, not to these functions. */
void *memset(void *dst, int c, size_t n) { __builtin_memset(dst, c, n); return dst; }
void *memcpy(void *dst, const void *src, size_t n) { __builtin_memcpy(dst, src, n); return dst; }
void *memmove(void *dst, const void *src, size_t n) { __builtin_memmove(dst, src, n); return dst; }
int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++) if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

WEEI_EXPORT("alloc") uint32_t weei_export_alloc(uint32_t bytes) { return weei_alloc_export(bytes); }
WEEI_EXPORT("free") void weei_export_free(uint32_t ptr) { weei_free_export(ptr); }
#endif

static uint32_t cstrlen(const char *s) { uint32_t n = 0; while (s[n]) n++; return n; }

int weei_streq(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return *a == *b;
}

/* ---- JSON reader ---------------------------------------------------------- */

#define WJ_MAX_DEPTH 32
#define WJ_MAX_TOKENS 4096

typedef struct {
    wj_doc *doc;
    uint32_t pos;
    const char *error;
} wj_parser;

static void wj_ws(wj_parser *p) {
    const char *t = p->doc->text;
    while (p->pos < p->doc->length) {
        char c = t[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->pos++; else break;
    }
}

static int wj_new_tok(wj_parser *p, uint8_t type) {
    wj_doc *d = p->doc;
    if (d->ntoks == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 64;
        if (cap > WJ_MAX_TOKENS) { p->error = "input JSON has too many values"; return -1; }
        wj_tok *t = weei_realloc(d->toks, cap * sizeof(wj_tok));
        if (!t) { p->error = "out of memory"; return -1; }
        d->toks = t;
        d->cap = cap;
    }
    wj_tok *tk = &d->toks[d->ntoks];
    tk->type = type; tk->start = p->pos; tk->end = p->pos; tk->next = 0; tk->count = 0;
    return (int)d->ntoks++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int wj_value(wj_parser *p, int depth);

static int wj_string_tok(wj_parser *p) {
    const char *t = p->doc->text;
    uint32_t n = p->doc->length;
    int i = wj_new_tok(p, WJ_STRING);
    if (i < 0) return -1;
    p->pos++; /* opening quote */
    p->doc->toks[i].start = p->pos;
    while (1) {
        if (p->pos >= n) { p->error = "unterminated string"; return -1; }
        unsigned char c = (unsigned char)t[p->pos];
        if (c == '"') break;
        if (c < 0x20) { p->error = "control character in string"; return -1; }
        if (c == '\\') {
            p->pos++;
            if (p->pos >= n) { p->error = "unterminated string"; return -1; }
            char e = t[p->pos];
            if (e == 'u') {
                if (p->pos + 4 >= n) { p->error = "bad \\u escape"; return -1; }
                for (int k = 1; k <= 4; k++) if (hexval(t[p->pos + k]) < 0) { p->error = "bad \\u escape"; return -1; }
                p->pos += 4;
            } else if (!(e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't')) {
                p->error = "bad escape in string"; return -1;
            }
        }
        p->pos++;
    }
    p->doc->toks[i].end = p->pos;
    p->pos++; /* closing quote */
    p->doc->toks[i].next = p->doc->ntoks;
    return i;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int wj_number_tok(wj_parser *p) {
    const char *t = p->doc->text;
    uint32_t n = p->doc->length;
    int i = wj_new_tok(p, WJ_NUMBER);
    if (i < 0) return -1;
    uint32_t s = p->pos;
    if (p->pos < n && t[p->pos] == '-') p->pos++;
    if (p->pos >= n || !is_digit(t[p->pos])) { p->error = "bad number"; return -1; }
    if (t[p->pos] == '0') p->pos++;
    else while (p->pos < n && is_digit(t[p->pos])) p->pos++;
    if (p->pos < n && t[p->pos] == '.') {
        p->pos++;
        if (p->pos >= n || !is_digit(t[p->pos])) { p->error = "bad number"; return -1; }
        while (p->pos < n && is_digit(t[p->pos])) p->pos++;
    }
    if (p->pos < n && (t[p->pos] == 'e' || t[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < n && (t[p->pos] == '+' || t[p->pos] == '-')) p->pos++;
        if (p->pos >= n || !is_digit(t[p->pos])) { p->error = "bad number"; return -1; }
        while (p->pos < n && is_digit(t[p->pos])) p->pos++;
    }
    p->doc->toks[i].start = s;
    p->doc->toks[i].end = p->pos;
    p->doc->toks[i].next = p->doc->ntoks;
    return i;
}

static int wj_literal(wj_parser *p, const char *lit, uint8_t type) {
    uint32_t len = cstrlen(lit);
    if (p->pos + len > p->doc->length) { p->error = "bad literal"; return -1; }
    for (uint32_t k = 0; k < len; k++) if (p->doc->text[p->pos + k] != lit[k]) { p->error = "bad literal"; return -1; }
    int i = wj_new_tok(p, type);
    if (i < 0) return -1;
    p->pos += len;
    p->doc->toks[i].end = p->pos;
    p->doc->toks[i].next = p->doc->ntoks;
    return i;
}

static int wj_value(wj_parser *p, int depth) {
    if (depth > WJ_MAX_DEPTH) { p->error = "input JSON nested too deeply"; return -1; }
    wj_ws(p);
    if (p->pos >= p->doc->length) { p->error = "unexpected end of input"; return -1; }
    char c = p->doc->text[p->pos];
    if (c == '{' || c == '[') {
        int obj = c == '{';
        int i = wj_new_tok(p, obj ? WJ_OBJECT : WJ_ARRAY);
        if (i < 0) return -1;
        p->pos++;
        wj_ws(p);
        uint32_t count = 0;
        char close = obj ? '}' : ']';
        if (p->pos < p->doc->length && p->doc->text[p->pos] == close) {
            p->pos++;
        } else {
            while (1) {
                if (obj) {
                    wj_ws(p);
                    if (p->pos >= p->doc->length || p->doc->text[p->pos] != '"') { p->error = "expected a member name"; return -1; }
                    if (wj_string_tok(p) < 0) return -1;
                    wj_ws(p);
                    if (p->pos >= p->doc->length || p->doc->text[p->pos] != ':') { p->error = "expected ':'"; return -1; }
                    p->pos++;
                }
                if (wj_value(p, depth + 1) < 0) return -1;
                count++;
                wj_ws(p);
                if (p->pos >= p->doc->length) { p->error = "unexpected end of input"; return -1; }
                char d = p->doc->text[p->pos++];
                if (d == ',') continue;
                if (d == close) break;
                p->error = obj ? "expected ',' or '}'" : "expected ',' or ']'";
                return -1;
            }
        }
        p->doc->toks[i].count = count;
        p->doc->toks[i].end = p->pos;
        p->doc->toks[i].next = p->doc->ntoks;
        return i;
    }
    if (c == '"') return wj_string_tok(p);
    if (c == '-' || is_digit(c)) return wj_number_tok(p);
    if (c == 't') return wj_literal(p, "true", WJ_TRUE);
    if (c == 'f') return wj_literal(p, "false", WJ_FALSE);
    if (c == 'n') return wj_literal(p, "null", WJ_NULL);
    p->error = "unexpected character";
    return -1;
}

int wj_parse(wj_doc *doc, const char *text, uint32_t length, const char **error) {
    doc->text = text;
    doc->length = length;
    doc->ntoks = 0;
    wj_parser p = { doc, 0, 0 };
    if (wj_value(&p, 0) < 0) { *error = p.error; return -1; }
    wj_ws(&p);
    if (p.pos != length) { *error = "trailing characters after the JSON value"; return -1; }
    return 0;
}

/* Compares a string token with a plain C string, decoding escapes. */
int wj_string_eq(const wj_doc *doc, int tok, const char *s) {
    if (tok < 0 || doc->toks[tok].type != WJ_STRING) return 0;
    char buf[256];
    uint32_t want = cstrlen(s);
    if (want >= sizeof buf) return 0;
    int n = wj_string(doc, tok, buf, sizeof buf);
    if (n < 0 || (uint32_t)n != want) return 0;
    for (uint32_t k = 0; k < want; k++) if (buf[k] != s[k]) return 0;
    return 1;
}

int wj_get(const wj_doc *doc, int obj, const char *key) {
    if (obj < 0 || doc->toks[obj].type != WJ_OBJECT) return -1;
    uint32_t i = (uint32_t)obj + 1;
    for (uint32_t m = 0; m < doc->toks[obj].count; m++) {
        uint32_t value = i + 1;
        if (wj_string_eq(doc, (int)i, key)) return (int)value;
        i = doc->toks[value].next;
    }
    return -1;
}

int wj_at(const wj_doc *doc, int arr, uint32_t index) {
    if (arr < 0 || doc->toks[arr].type != WJ_ARRAY || index >= doc->toks[arr].count) return -1;
    uint32_t i = (uint32_t)arr + 1;
    for (uint32_t k = 0; k < index; k++) i = doc->toks[i].next;
    return (int)i;
}

static double pow10_exact(int e) {
    static const double t[] = { 1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22 };
    if (e >= 0 && e <= 22) return t[e];
    double r = 1.0;
    if (e > 0) { while (e > 22) { r *= 1e22; e -= 22; } return r * t[e]; }
    e = -e;
    while (e > 22) { r /= 1e22; e -= 22; }
    return r / t[e];
}

int wj_number(const wj_doc *doc, int tok, double *out) {
    if (tok < 0 || doc->toks[tok].type != WJ_NUMBER) return -1;
    const char *t = doc->text;
    uint32_t i = doc->toks[tok].start, end = doc->toks[tok].end;
    int neg = 0;
    if (t[i] == '-') { neg = 1; i++; }
    uint64_t mant = 0;
    int digits = 0, exp10 = 0;
    for (; i < end && is_digit(t[i]); i++) {
        if (digits < 19) { mant = mant * 10 + (uint64_t)(t[i] - '0'); if (mant) digits++; }
        else exp10++;
    }
    if (i < end && t[i] == '.') {
        for (i++; i < end && is_digit(t[i]); i++) {
            if (digits < 19) { mant = mant * 10 + (uint64_t)(t[i] - '0'); if (mant) digits++; exp10--; }
        }
    }
    if (i < end && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        int eneg = 0, e = 0;
        if (t[i] == '+') i++; else if (t[i] == '-') { eneg = 1; i++; }
        for (; i < end && is_digit(t[i]); i++) if (e < 100000) e = e * 10 + (t[i] - '0');
        exp10 += eneg ? -e : e;
    }
    double v;
    if (mant == 0) v = 0.0;
    else if (exp10 > 330) v = 1e308 * 10.0;
    else if (exp10 < -360) v = 0.0;
    else if (exp10 < 0) v = (double)mant / pow10_exact(-exp10);   /* exact for mant < 2^53, -exp10 <= 22 */
    else v = (double)mant * pow10_exact(exp10);
    *out = neg ? -v : v;
    return 0;
}

int wj_uint(const wj_doc *doc, int tok, uint64_t *out) {
    if (tok < 0 || doc->toks[tok].type != WJ_NUMBER) return -1;
    const char *t = doc->text;
    uint32_t i = doc->toks[tok].start, end = doc->toks[tok].end;
    uint64_t v = 0;
    if (i >= end || !is_digit(t[i])) return -1;
    for (; i < end; i++) {
        if (!is_digit(t[i])) return -1; /* fraction, exponent or sign */
        uint64_t d = (uint64_t)(t[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int wj_u64_string(const wj_doc *doc, int tok, uint64_t *out) {
    if (tok < 0) return -1;
    if (doc->toks[tok].type == WJ_NUMBER) return wj_uint(doc, tok, out);
    if (doc->toks[tok].type != WJ_STRING) return -1;
    const char *t = doc->text;
    uint32_t i = doc->toks[tok].start, end = doc->toks[tok].end;
    if (i >= end || end - i > 20) return -1;
    uint64_t v = 0;
    for (; i < end; i++) {
        if (!is_digit(t[i])) return -1;
        uint64_t d = (uint64_t)(t[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static uint32_t put_utf8(char *buf, uint32_t cap, uint32_t n, uint32_t cp) {
    char tmp[4];
    uint32_t len;
    if (cp < 0x80) { tmp[0] = (char)cp; len = 1; }
    else if (cp < 0x800) { tmp[0] = (char)(0xC0 | (cp >> 6)); tmp[1] = (char)(0x80 | (cp & 0x3F)); len = 2; }
    else if (cp < 0x10000) { tmp[0] = (char)(0xE0 | (cp >> 12)); tmp[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); tmp[2] = (char)(0x80 | (cp & 0x3F)); len = 3; }
    else { tmp[0] = (char)(0xF0 | (cp >> 18)); tmp[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); tmp[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); tmp[3] = (char)(0x80 | (cp & 0x3F)); len = 4; }
    for (uint32_t k = 0; k < len; k++) { if (n + 1 < cap) buf[n] = tmp[k]; n++; }
    return n;
}

int wj_string(const wj_doc *doc, int tok, char *buf, uint32_t cap) {
    if (tok < 0 || doc->toks[tok].type != WJ_STRING || cap == 0) return -1;
    const char *t = doc->text;
    uint32_t i = doc->toks[tok].start, end = doc->toks[tok].end, n = 0;
    while (i < end) {
        char c = t[i++];
        if (c != '\\') { if (n + 1 < cap) buf[n] = c; n++; continue; }
        char e = t[i++];
        uint32_t cp;
        switch (e) {
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            cp = (uint32_t)(hexval(t[i]) << 12 | hexval(t[i + 1]) << 8 | hexval(t[i + 2]) << 4 | hexval(t[i + 3]));
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= end && t[i] == '\\' && t[i + 1] == 'u') {
                int a = hexval(t[i + 2]), b = hexval(t[i + 3]), c2 = hexval(t[i + 4]), d = hexval(t[i + 5]);
                uint32_t lo = (uint32_t)(a << 12 | b << 8 | c2 << 4 | d);
                if (lo >= 0xDC00 && lo < 0xE000) { cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00); i += 6; }
            }
            break;
        default: cp = (uint32_t)(unsigned char)e; break;
        }
        n = put_utf8(buf, cap, n, cp);
    }
    buf[n < cap ? n : cap - 1] = 0;
    return (int)(n < cap ? n : cap - 1);
}

int wj_region(const wj_doc *doc, int tok, weei_region *out, const char **error) {
    uint64_t ptr, bytes;
    if (tok < 0 || doc->toks[tok].type != WJ_OBJECT) { *error = "expected a region {ptr, bytes}"; return -1; }
    if (wj_uint(doc, wj_get(doc, tok, "ptr"), &ptr) || wj_uint(doc, wj_get(doc, tok, "bytes"), &bytes)) {
        *error = "a region needs integer ptr and bytes";
        return -1;
    }
    if (ptr + bytes > weei_memory_bytes() || (bytes && ptr == 0)) { *error = "region lies outside module memory"; return -1; }
    out->data = (uint8_t *)weei_addr((uint32_t)ptr);
    out->bytes = (uint32_t)bytes;
    return 0;
}

/* ---- writers ------------------------------------------------------------------ */

typedef struct {
    char *buf;
    uint32_t len, cap;
    int oom;
    int depth;
    int after_key;
    uint8_t first[WJ_MAX_DEPTH + 2];
} jw_state;

static jw_state g_result, g_progress_w;
static jw_state *g_w = &g_result;

static void jw_reset(jw_state *w) {
    w->len = 0;
    w->oom = 0;
    w->depth = 0;
    w->after_key = 0;
    w->first[0] = 1;
}

static void jw_put(const char *s, uint32_t n) {
    jw_state *w = g_w;
    if (w->oom) return;
    if (w->len + n > w->cap) {
        uint32_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) cap *= 2;
        char *b = weei_realloc(w->buf, cap);
        if (!b) { w->oom = 1; return; }
        w->buf = b;
        w->cap = cap;
    }
    weei_memcopy(w->buf + w->len, s, n);
    w->len += n;
}

static void jw_putc(char c) { jw_put(&c, 1); }

static void jw_prefix(void) {
    jw_state *w = g_w;
    if (w->after_key) { w->after_key = 0; return; }
    if (!w->first[w->depth]) jw_putc(',');
    w->first[w->depth] = 0;
}

static void jw_open(char c) {
    jw_prefix();
    jw_putc(c);
    if (g_w->depth < WJ_MAX_DEPTH) g_w->depth++;
    g_w->first[g_w->depth] = 1;
}

static void jw_close(char c) {
    if (g_w->depth > 0) g_w->depth--;
    jw_putc(c);
}

void jw_obj_begin(void) { jw_open('{'); }
void jw_obj_end(void) { jw_close('}'); }
void jw_arr_begin(void) { jw_open('['); }
void jw_arr_end(void) { jw_close(']'); }

static void jw_escaped(const char *s) {
    static const char hex[] = "0123456789abcdef";
    jw_putc('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { jw_putc('\\'); jw_putc((char)c); }
        else if (c == '\n') jw_put("\\n", 2);
        else if (c < 0x20) { char u[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] }; jw_put(u, 6); }
        else jw_putc((char)c);
    }
    jw_putc('"');
}

void jw_key(const char *key) {
    jw_prefix();
    jw_escaped(key);
    jw_putc(':');
    g_w->after_key = 1;
}

void jw_str(const char *s) { jw_prefix(); jw_escaped(s); }

static uint32_t fmt_u64(uint64_t v, char *out) {
    char tmp[24];
    uint32_t n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    for (uint32_t k = 0; k < n; k++) out[k] = tmp[n - 1 - k];
    return n;
}

void jw_uint(uint64_t v) {
    char b[24];
    jw_prefix();
    jw_put(b, fmt_u64(v, b));
}

void jw_int(int64_t v) {
    char b[24];
    jw_prefix();
    if (v < 0) { jw_putc('-'); jw_put(b, fmt_u64((uint64_t)(-(v + 1)) + 1, b)); }
    else jw_put(b, fmt_u64((uint64_t)v, b));
}

/* Nine significant digits: enough to round-trip a float32 value. */
static uint32_t fmt_double(double v, char *out) {
    uint32_t n = 0;
    if (v < 0) { out[n++] = '-'; v = -v; }
    if (v == 0.0) { out[n++] = '0'; return n; }
    if (v < 1e15 && (double)(uint64_t)v == v) return n + fmt_u64((uint64_t)v, out + n);
    int e = 0;
    while (e < 308 && pow10_exact(e + 1) <= v) e++;
    while (e > -324 && pow10_exact(e) > v) e--;
    double scaled;
    if (e >= 8) scaled = v / pow10_exact(e - 8);
    else if (e < -290) scaled = (v * 1e300) * pow10_exact(8 - e - 300); /* 10^(8-e) alone would overflow */
    else scaled = v * pow10_exact(8 - e);
    uint64_t digits = (uint64_t)(scaled + 0.5);
    if (digits >= 1000000000ull) { digits = (digits + 5) / 10; e++; }
    if (digits < 100000000ull) digits = 100000000ull;
    char d[10];
    fmt_u64(digits, d);
    int nd = 9;
    while (nd > 1 && d[nd - 1] == '0') nd--;
    if (e >= -5 && e < 15) {
        if (e >= 0) {
            for (int k = 0; k <= e; k++) out[n++] = k < nd ? d[k] : '0';
            if (nd > e + 1) { out[n++] = '.'; for (int k = e + 1; k < nd; k++) out[n++] = d[k]; }
        } else {
            out[n++] = '0'; out[n++] = '.';
            for (int k = 0; k < -e - 1; k++) out[n++] = '0';
            for (int k = 0; k < nd; k++) out[n++] = d[k];
        }
        return n;
    }
    out[n++] = d[0];
    if (nd > 1) { out[n++] = '.'; for (int k = 1; k < nd; k++) out[n++] = d[k]; }
    out[n++] = 'e';
    if (e < 0) { out[n++] = '-'; e = -e; }
    n += fmt_u64((uint64_t)e, out + n);
    return n;
}

void jw_num(double v) {
    if (!weei_isfinite_f64(v)) { jw_null(); return; }
    char b[40];
    jw_prefix();
    jw_put(b, fmt_double(v, b));
}

void jw_bool(int v) { jw_prefix(); if (v) jw_put("true", 4); else jw_put("false", 5); }
void jw_null(void) { jw_prefix(); jw_put("null", 4); }
void jw_raw(const char *json) { jw_prefix(); jw_put(json, cstrlen(json)); }

void jw_region(const void *p, uint32_t bytes) {
    jw_obj_begin();
    jw_key("ptr"); jw_uint(weei_off(p));
    jw_key("bytes"); jw_uint(bytes);
    jw_obj_end();
}

static int g_failed;

int weei_fail(const char *msg) {
    jw_state *saved = g_w;
    g_w = &g_result;
    jw_reset(&g_result);
    jw_obj_begin();
    jw_key("error");
    jw_str(msg);
    jw_obj_end();
    g_w = saved;
    g_failed = 1;
    return -1;
}

void weei_msg_str(weei_msg *m, const char *s) {
    while (*s && m->len + 1 < sizeof m->buf) m->buf[m->len++] = *s++;
    m->buf[m->len] = 0;
}

void weei_msg_int(weei_msg *m, int64_t v) {
    char b[24];
    uint32_t n;
    if (v < 0) { weei_msg_str(m, "-"); n = fmt_u64((uint64_t)(-(v + 1)) + 1, b); }
    else n = fmt_u64((uint64_t)v, b);
    b[n] = 0;
    weei_msg_str(m, b);
}

/* ---- operations ------------------------------------------------------------------ */

static uint32_t g_result_length;
static const char k_oom_result[] = "{\"error\":\"out of memory\"}";

static wj_doc g_doc;

static uint64_t g_progress_step; /* step of the last report of this operation */
static int g_progress_any;       /* 1 once this operation has reported */

static uint32_t run_op(uint32_t ptr, uint32_t bytes, weei_op_fn fn) {
    heap_init();
    g_progress_any = 0;
    g_w = &g_result;
    jw_reset(&g_result);
    g_failed = 0;
    const char *error = 0;
    if ((uint64_t)ptr + bytes > weei_memory_bytes() || (bytes && ptr == 0)) {
        weei_fail("input lies outside module memory");
    } else if (wj_parse(&g_doc, (const char *)weei_addr(ptr), bytes, &error) != 0) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "malformed input JSON: ");
        weei_msg_str(&m, error);
        weei_fail(m.buf);
    } else if (g_doc.toks[0].type != WJ_OBJECT) {
        weei_fail("input must be a JSON object");
    } else if (fn(&g_doc) != 0 && !g_failed) {
        weei_fail("operation failed");
    }
    if (g_result.oom) {
        g_result_length = sizeof k_oom_result - 1;
        return weei_off(k_oom_result);
    }
    g_result_length = g_result.len;
    return weei_off(g_result.buf);
}

static int op_info(const wj_doc *in) { return model_get_info(in); }

static int op_create(const wj_doc *in) {
    uint64_t seed;
    int t = wj_get(in, 0, "seed");
    if (t < 0) return weei_fail("createInitialWeights needs a seed");
    if (wj_u64_string(in, t, &seed) != 0) return weei_fail("seed must be an unsigned 64-bit integer as a decimal string");
    return model_create_initial_weights(in, seed);
}

static int op_load(const wj_doc *in) {
    weei_region r;
    const char *error;
    if (wj_region(in, wj_get(in, 0, "weights"), &r, &error) != 0) return weei_fail(error);
    return model_load(in, &r);
}

static int op_load_aux(const wj_doc *in) {
    int slots = wj_get(in, 0, "slots");
    if (slots < 0 || in->toks[slots].type != WJ_ARRAY) return weei_fail("loadAuxiliary needs a slots array");
    return model_load_auxiliary(in, slots);
}

static int op_describe(const wj_doc *in) {
    char format[128];
    weei_region r;
    const char *error;
    if (wj_string(in, wj_get(in, 0, "format"), format, sizeof format) < 0) return weei_fail("describeChunk needs a format");
    if (wj_region(in, wj_get(in, 0, "data"), &r, &error) != 0) return weei_fail(error);
    return model_describe_chunk(in, format, &r);
}

static int op_train(const wj_doc *in) { return model_train(in); }
static int op_evaluate(const wj_doc *in) { return model_evaluate(in); }

WEEI_EXPORT("getModelInfo") uint32_t weei_op_get_model_info(uint32_t p, uint32_t n) { return run_op(p, n, op_info); }
WEEI_EXPORT("createInitialWeights") uint32_t weei_op_create_initial_weights(uint32_t p, uint32_t n) { return run_op(p, n, op_create); }
WEEI_EXPORT("loadModel") uint32_t weei_op_load_model(uint32_t p, uint32_t n) { return run_op(p, n, op_load); }
WEEI_EXPORT("loadAuxiliary") uint32_t weei_op_load_auxiliary(uint32_t p, uint32_t n) { return run_op(p, n, op_load_aux); }
WEEI_EXPORT("describeChunk") uint32_t weei_op_describe_chunk(uint32_t p, uint32_t n) { return run_op(p, n, op_describe); }
WEEI_EXPORT("train") uint32_t weei_op_train(uint32_t p, uint32_t n) { return run_op(p, n, op_train); }
WEEI_EXPORT("evaluate") uint32_t weei_op_evaluate(uint32_t p, uint32_t n) { return run_op(p, n, op_evaluate); }
uint32_t weei_run_op(uint32_t ptr, uint32_t bytes, weei_op_fn fn) { return run_op(ptr, bytes, fn); }

WEEI_EXPORT("resultLength") uint32_t weei_result_length(void) { return g_result_length; }

/* ---- common inputs ------------------------------------------------------------------ */

static int read_positive_int(const wj_doc *in, int obj, const char *key, uint32_t *out, const char *msg) {
    int t = wj_get(in, obj, key);
    if (t < 0 || in->toks[t].type == WJ_NULL) return 0;
    uint64_t v;
    double d;
    if (wj_uint(in, t, &v) != 0) {
        /* Accept integral numbers written as 2.0 or 1e1 too. */
        if (wj_number(in, t, &d) != 0 || d < 1 || d > 1e9 || (double)(uint64_t)d != d) return weei_fail(msg);
        v = (uint64_t)d;
    }
    if (v < 1 || v > 1000000000u) return weei_fail(msg);
    *out = (uint32_t)v;
    return 0;
}

int weei_read_settings(const wj_doc *in, weei_settings *s, uint32_t default_batch, float default_lr) {
    s->local_epochs = 1;
    s->batch_size = default_batch;
    s->learning_rate = default_lr;
    s->has_learning_rate = 0;
    int st = wj_get(in, 0, "settings");
    if (st < 0 || in->toks[st].type == WJ_NULL) return 0;
    if (in->toks[st].type != WJ_OBJECT) return weei_fail("settings must be an object");
    if (read_positive_int(in, st, "localEpochs", &s->local_epochs, "settings.localEpochs must be a positive integer")) return -1;
    if (read_positive_int(in, st, "batchSize", &s->batch_size, "settings.batchSize must be a positive integer")) return -1;
    int lr = wj_get(in, st, "learningRate");
    if (lr >= 0 && in->toks[lr].type != WJ_NULL) {
        double v;
        if (wj_number(in, lr, &v) != 0 || !(v > 0) || !(v <= 1e3)) return weei_fail("settings.learningRate must be a positive number");
        s->learning_rate = (float)v;
        s->has_learning_rate = 1;
    }
    return 0;
}

int weei_read_experience(const wj_doc *in, weei_experience *e) {
    int t = wj_get(in, 0, "experience");
    if (t < 0) return 0;
    if (in->toks[t].type != WJ_OBJECT) return weei_fail("experience must be an object");
    uint64_t count;
    if (wj_uint(in, wj_get(in, t, "unitStart"), &e->unit_start) != 0) return weei_fail("experience.unitStart must be a non-negative integer");
    if (wj_uint(in, wj_get(in, t, "unitCount"), &count) != 0 || count > 0xFFFFFFFFu) return weei_fail("experience.unitCount must be a non-negative integer");
    e->unit_count = (uint32_t)count;
    if (wj_u64_string(in, wj_get(in, t, "seed"), &e->seed) != 0) return weei_fail("experience.seed must be an unsigned 64-bit integer as a decimal string");
    return 1;
}

int weei_read_seed(const wj_doc *in, uint64_t *seed) {
    int t = wj_get(in, 0, "seed");
    *seed = 0;
    if (t < 0) return 0;
    if (wj_u64_string(in, t, seed) != 0) return weei_fail("seed must be an unsigned 64-bit integer as a decimal string");
    return 0;
}

/* ---- progress ------------------------------------------------------------------------ */

#if defined(__wasm__)
__attribute__((import_module("weei"), import_name("onProgress"))) void weei_on_progress(uint32_t ptr, uint32_t bytes);
#else
/* Native builds (benchmark): a hook the driver may set; no import exists. */
void (*weei_native_progress_hook)(const char *json, uint32_t bytes);
static void weei_on_progress(uint32_t ptr, uint32_t bytes) {
    if (weei_native_progress_hook) weei_native_progress_hook((const char *)weei_addr(ptr), bytes);
}
#endif

void weei_progress(uint64_t processed, uint64_t total, const char *const *metric_ids,
                   const double *metric_values, int metric_count) {
    /* At most one report per 1% of the work (a step is total/100 examples,
     * at least one), plus the final one: each report costs the host a JSON
     * parse and, in the browser, a message across the Worker boundary. */
    uint64_t quantum = total / 100u ? total / 100u : 1u;
    uint64_t step = processed / quantum;
    if (processed < total && g_progress_any && step == g_progress_step) return;
    g_progress_any = 1;
    g_progress_step = step;
    jw_state *saved = g_w;
    g_w = &g_progress_w;
    jw_reset(&g_progress_w);
    jw_obj_begin();
    jw_key("processedExamples"); jw_uint(processed);
    jw_key("totalExamples"); jw_uint(total);
    if (metric_count > 0) {
        jw_key("metrics");
        jw_obj_begin();
        for (int i = 0; i < metric_count; i++) { jw_key(metric_ids[i]); jw_num(metric_values[i]); }
        jw_obj_end();
    }
    jw_obj_end();
    g_w = saved;
    if (!g_progress_w.oom) weei_on_progress(weei_off(g_progress_w.buf), g_progress_w.len);
}

/* ---- random numbers ---------------------------------------------------------------- */

uint32_t weei_rng_below(weei_rng *r, uint32_t n) {
    /* Lemire's multiply-shift with rejection: exactly uniform. */
    uint64_t m = (weei_rng_next(r) >> 32) * (uint64_t)n;
    uint32_t low = (uint32_t)m;
    if (low < n) {
        uint32_t threshold = (uint32_t)(-n) % n;
        while (low < threshold) {
            m = (weei_rng_next(r) >> 32) * (uint64_t)n;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void weei_shuffle_u32(weei_rng *r, uint32_t *a, uint32_t n) {
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = weei_rng_below(r, i);
        uint32_t t = a[i - 1]; a[i - 1] = a[j]; a[j] = t;
    }
}
