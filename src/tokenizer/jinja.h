/*
 * jinja.h: the Jinja2-subset interpreter's insides, shared by jinja_value.c (values, arena,
 * JSON), jinja_lex.c (tokens), jinja_parse.c (the AST, refusals) and jinja_eval.c (rendering).
 * Outside src/tokenizer only tmpl.h is used.
 *
 * Invariants: every value, string and AST node lives in a jarena (one per loaded template for
 * the AST, one per render for values) and is never freed alone; values are immutable except
 * a namespace's dict (ns.attr assignment). Strings are UTF-8 byte spans, not NUL-terminated.
 * An arena refuses to grow past its cap (KVR_ETOOBIG), which bounds a render's memory.
 * Threads: none; a template's AST is read-only once parsed and may be rendered by several
 * threads at once, each render with its own arena. Cost: see each file.
 */
#ifndef KVR_TOKENIZER_JINJA_H
#define KVR_TOKENIZER_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- arena ----------------------------------------------------------------------------- */
struct jchunk;
struct jarena {
    struct jchunk *head;
    size_t total; /* bytes of chunks held */
    size_t cap;   /* refuse to hold more than this */
};
void ja_init(struct jarena *a, size_t cap);
void ja_free(struct jarena *a);
void *ja_alloc(struct jarena *a, size_t n); /* 16-aligned; NULL past the cap or on ENOMEM */
char *ja_strdup(struct jarena *a, const char *p, size_t n);
/* The arena as it is (mark), and back to it (rollback: what was allocated since freed). */
struct jmark {
    struct jchunk *head;
    size_t used, total;
};
void ja_mark(const struct jarena *a, struct jmark *m);
void ja_rollback(struct jarena *a, const struct jmark *m);

/* --- values ---------------------------------------------------------------------------- */
enum jv_kind {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,
    JV_FUNC,
    JV_LOOP,
    JV_MACRO
};
struct jlist;
struct jdict;
struct jloop;
struct jv {
    uint8_t kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct jlist *l;
        struct jdict *d; /* JV_DICT and JV_NS */
        int fn;          /* JV_FUNC: enum jfunc */
        const struct jloop *loop;
        const struct jnode *macro; /* JV_MACRO: its JN_MACRO node */
    } u;
};
/* What Python object a JV_LIST stands for: a list, a tuple ((a, b)), a one-pass iterator (the
 * generators of select/map/items/unique and reversed(): always true, no len, no index, not
 * printable or JSON; pos is how far it was consumed), a dict view (.items() .keys() .values():
 * len, no index) or a range (len and index). */
enum jl_kind { JL_LIST, JL_TUPLE, JL_GEN, JL_VIEW, JL_RANGE };
struct jlist {
    size_t n, cap;
    size_t pos; /* JL_GEN: items before pos were consumed */
    uint8_t kind;
    struct jv *a;
};
struct jdict {
    size_t n, cap;
    struct jv *k, *v; /* insertion order, like Python's dict */
};
struct jloop {
    int64_t index0, length;
    const struct jlist *items; /* previtem, nextitem */
};
enum jfunc { JF_RAISE, JF_STRFTIME, JF_NAMESPACE, JF_RANGE };

static inline struct jv jv_undef(void) { return (struct jv){.kind = JV_UNDEF}; }
static inline struct jv jv_none(void) { return (struct jv){.kind = JV_NONE}; }
static inline struct jv jv_bool(bool b) { return (struct jv){.kind = JV_BOOL, .u.b = b}; }
static inline struct jv jv_int(int64_t i) { return (struct jv){.kind = JV_INT, .u.i = i}; }
static inline struct jv jv_float(double f) { return (struct jv){.kind = JV_FLOAT, .u.f = f}; }
static inline struct jv jv_str(const char *p, size_t n)
{
    return (struct jv){.kind = JV_STR, .u.s = {p, n}};
}

/* A growable byte buffer (malloc'd, bounded by max); err set once a bound or malloc failed. */
struct jbuf {
    char *p;
    size_t n, cap, max;
    int err;
};
void jb_put(struct jbuf *b, const char *p, size_t n);
static inline void jb_puts(struct jbuf *b, const char *s);
void jb_putc(struct jbuf *b, char c);

struct jlist *jl_new(struct jarena *a, size_t cap);
int jl_push(struct jarena *a, struct jlist *l, struct jv v); /* KVR_OK or KVR_ETOOBIG */
struct jdict *jd_new(struct jarena *a, size_t cap);
int jd_set(struct jarena *a, struct jdict *d, struct jv k, struct jv v); /* replace or append */
const struct jv *jd_get(const struct jdict *d, struct jv k);
const struct jv *jd_gets(const struct jdict *d, const char *k, size_t n);

bool jv_truthy(struct jv v);
bool jv_eq(struct jv a, struct jv b);
/* Strictly the same JSON value: kinds, bytes, number bits, members in order (jv_eq takes
 * 1 == 1.0 == true): what the JSON reader's checks compare. */
bool jv_same(struct jv a, struct jv b);
/* <0, 0, >0 into *out; KVR_EINVAL when Python would raise TypeError. */
int jv_cmp(struct jv a, struct jv b, int *out);
size_t utf8_count(const char *p, size_t n);
/* Python's str(v) appended to b (repr for the items of lists and dicts). */
void jv_str_to(struct jbuf *b, struct jv v);
void jv_repr_to(struct jbuf *b, struct jv v);
void jv_float_repr(double f, char out[40]);
/* HF's tojson: json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent NULL: none.
 * KVR_EINVAL (message in err) for values JSON cannot hold. */
int jv_tojson(struct jbuf *b, struct jv v, bool ensure_ascii, const char *indent, size_t ilen,
              bool has_indent, const char *item_sep, const char *key_sep, bool sort_keys, int depth,
              char *err, size_t errlen);
/* JSON text -> value (objects keep member order; integers with no '.', 'e' are ints), as yajl
 * reads it (jinja_json.c). */
int jv_from_json(struct jarena *a, const char *json, size_t len, struct jv *out, char *err,
                 size_t errlen);
/* Its two readers (tests compare them): the one-pass reader, KVR_OK or KVR_EPARSE when it
 * passes the text on (the arena as it was); yajl's tree, which decides what the first does
 * not take (errors with their message in err). */
int jv_from_json_text(struct jarena *a, const char *json, size_t len, struct jv *out);
int jv_from_json_yajl(struct jarena *a, const char *json, size_t len, struct jv *out, char *err,
                      size_t errlen);
const char *jv_type_name(struct jv v);

static inline void jb_puts(struct jbuf *b, const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    jb_put(b, s, n);
}

/* Bytes of the Python whitespace character at p (str.isspace), 0 when none. */
size_t jinja_space_len(const char *p, size_t n);
/* The first occurrence of q[0..m) (m > 0) in p[0..n), or NULL: glibc's memmem, linear, where
 * a memcmp at every position cost a chat's render most of its time ('</think>' in content). */
const char *jinja_find(const char *p, size_t n, const char *q, size_t m);

/* --- tokens ---------------------------------------------------------------------------- */
enum jtok_kind {
    JT_EOF,
    JT_DATA,      /* text between tags, whitespace control applied */
    JT_VAR_BEGIN, /* {{ */
    JT_VAR_END,
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING, /* escapes decoded */
    JT_INT,
    JT_FLOAT,
    JT_OP /* operator or punctuation: text in p/n */
};
struct jtok {
    int kind;
    int line;
    const char *p; /* JT_DATA, JT_NAME, JT_STRING, JT_OP: text (arena or source) */
    size_t n;
    int64_t i;
    double f;
};
/* Tokenizes src (newlines normalized, one trailing newline dropped, trim_blocks and
 * lstrip_blocks on, as transformers configures Jinja). *toks is malloc'd (free it). */
int jinja_lex(struct jarena *a, const char *src, size_t len, struct jtok **toks, size_t *ntok,
              char *err, size_t errlen);

/* --- AST ------------------------------------------------------------------------------- */
enum jn_kind {
    /* statements */
    JN_BLOCK,
    JN_TEXT,
    JN_OUT,
    JN_IF,
    JN_FOR,
    JN_SET,
    JN_SETATTR,
    JN_BREAK,
    JN_CONTINUE,
    JN_MACRO, /* name; kids: parameters (JE_NAME, ->a the default or NULL); b: the body */
    /* expressions */
    JE_CONST,
    JE_NAME,
    JE_ATTR,
    JE_ITEM,
    JE_SLICE,
    JE_CALL,
    JE_METHOD,
    JE_FILTER,
    JE_TEST,
    JE_BIN,
    JE_NOT,
    JE_NEG,
    JE_POS,
    JE_AND,
    JE_OR,
    JE_COND,
    JE_LIST,
    JE_TUPLE,
    JE_DICT,
    JE_CMP
};
enum jfilter {
    JFL_TRIM,
    JFL_LENGTH,
    JFL_TOJSON,
    JFL_ITEMS,
    JFL_STRING,
    JFL_UPPER,
    JFL_LOWER,
    JFL_DEFAULT,
    JFL_JOIN,
    JFL_REPLACE,
    JFL_FIRST,
    JFL_LAST,
    JFL_LIST,
    JFL_SELECTATTR,
    JFL_REJECTATTR,
    JFL_MAP,
    JFL_REVERSE,
    JFL_INT,
    JFL_FLOAT,
    JFL_ABS,
    JFL_CAPITALIZE,
    JFL_SAFE,
    JFL_SELECT,
    JFL_REJECT,
    JFL_UNIQUE,
    JFL_SORT,
    JFL_TITLE
};
/* JTS_EQ..JTS_IN stay contiguous and in enum jcmp order (the evaluator maps one to the other) */
enum jtest {
    JTS_DEFINED,
    JTS_UNDEFINED,
    JTS_NONE,
    JTS_STRING,
    JTS_MAPPING,
    JTS_SEQUENCE,
    JTS_NUMBER,
    JTS_ITERABLE,
    JTS_BOOLEAN,
    JTS_TRUE,
    JTS_FALSE,
    JTS_INTEGER,
    JTS_FLOAT,
    JTS_EQ,
    JTS_NE,
    JTS_LT,
    JTS_LE,
    JTS_GT,
    JTS_GE,
    JTS_IN,
    JTS_ODD,
    JTS_EVEN,
    JTS_DIVISIBLEBY,
    JTS_CALLABLE,
    JTS_LOWER,
    JTS_UPPER,
    JTS_SAMEAS
};
enum jmethod {
    JM_STARTSWITH,
    JM_ENDSWITH,
    JM_STRIP,
    JM_LSTRIP,
    JM_RSTRIP,
    JM_SPLIT,
    JM_UPPER,
    JM_LOWER,
    JM_REPLACE,
    JM_TITLE,
    JM_CAPITALIZE,
    JM_FIND,
    JM_ITEMS,
    JM_KEYS,
    JM_VALUES,
    JM_GET,
    JM_RSPLIT
};
/* comparison operators of JE_CMP */
enum jcmp { JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN, JC_NOTIN };

struct jnode {
    uint8_t kind;
    int op;      /* JE_BIN: '+','-','*','/','%','~','F' (//),'P' (**); filter/test/method id */
    bool negate; /* JE_TEST: is not */
    int line;
    const char *name; /* JE_NAME, JE_ATTR, JN_SET, JN_SETATTR (the namespace), JN_TEXT text */
    size_t name_len;
    const char *attr; /* JN_SETATTR */
    size_t attr_len;
    struct jv val; /* JE_CONST */
    struct jnode *a, *b, *c, *d;
    struct jnode **kids; /* args, items, statements; JE_CMP: operands after a */
    size_t nkids;
    const char **kwn; /* keyword argument names (NUL-terminated, arena) */
    struct jnode **kwv;
    size_t nkw;
    int *ops; /* JE_CMP: enum jcmp per operand */
};

/* Parses tokens into a JN_BLOCK; refuses (KVR_EPARSE, "template line N: ...") every construct
 * outside the subset. Nesting is bounded by max_depth. */
int jinja_parse(struct jarena *a, const char *src, size_t len, int max_depth, struct jnode **root,
                char *err, size_t errlen);

/* --- rendering ------------------------------------------------------------------------- */
struct jvar {
    const char *name;
    size_t n;
    struct jv v;
};
struct jrender_opts {
    size_t max_output;  /* bytes of output */
    size_t max_memory;  /* arena bytes */
    uint64_t max_steps; /* nodes evaluated (loops included) */
    int max_depth;      /* evaluation recursion */
    int64_t now_s;      /* strftime_now's clock (Unix seconds, local time) */
};
/* Renders root with the given variables (values in arena a). Output malloc'd into *out.
 * Errors: KVR_EINVAL (template raised or a type error; "raise_exception: msg" for the former),
 * KVR_ETOOBIG (a bound), KVR_ENOMEM. err holds "template line N: ..." */
int jinja_render(const struct jnode *root, struct jarena *a, const struct jvar *vars, size_t nvars,
                 const struct jrender_opts *o, char **out, size_t *out_len, char *err,
                 size_t errlen);

#endif
