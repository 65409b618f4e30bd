"""What a model-written query may use, per dialect: functions, types and operators (allowlists, not
blocklists; names as the engine's parser spells them, lower case), and the short blocklist the SQLite
authorizer still applies (``is_dangerous_function``, defence in depth)."""

from __future__ import annotations

# fmt: off
_COMMON = {
    # aggregates
    "count", "sum", "avg", "min", "max",
    # window
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead", "first_value",
    "last_value", "nth_value",
    # math
    "abs", "ceil", "ceiling", "floor", "round", "trunc", "sign", "sqrt", "power", "pow", "exp", "ln", "log",
    "log10", "mod", "pi", "degrees", "radians", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "random",
    # string
    "length", "lower", "upper", "ltrim", "rtrim", "replace", "substr", "substring", "concat", "concat_ws",
}

SQLITE_FUNCTIONS: frozenset[str] = frozenset(_COMMON | {
    # aggregates
    "total", "group_concat", "string_agg",
    # string
    "trim", "instr", "octet_length", "char", "unicode", "hex", "like", "glob",
    # conditional / type
    "coalesce", "ifnull", "iif", "if", "nullif", "typeof",
    # math (SQLite's math extension, when compiled in)
    "log2",
    # date/time
    "date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff",
    # JSON (scalar; the table-valued json_each/json_tree are not relations a query may read)
    "json_extract", "json_array_length", "json_type", "json_valid",
})
"""SQLite functions a query may call (names compared case-insensitively, as SQLite does)."""

POSTGRES_FUNCTIONS: frozenset[str] = frozenset(_COMMON | {
    # aggregates
    "string_agg", "array_agg", "bool_and", "bool_or", "every", "stddev", "stddev_pop", "stddev_samp", "variance",
    "var_pop", "var_samp", "corr", "covar_pop", "covar_samp", "regr_slope", "regr_intercept", "regr_r2",
    "regr_count", "percentile_cont", "percentile_disc", "mode",
    # math
    "cbrt", "div", "width_bucket", "gcd", "lcm", "scale",
    # string (TRIM(...) is btrim/ltrim/rtrim, POSITION(a IN b) is position, SIMILAR TO uses similar_to_escape)
    "btrim", "char_length", "character_length", "octet_length", "initcap", "left", "right", "strpos", "position",
    "translate", "split_part", "reverse", "starts_with", "ascii", "chr", "overlay", "regexp_replace",
    "regexp_match", "regexp_like", "regexp_count", "regexp_substr", "regexp_instr", "similar_to_escape",
    "string_to_array", "array_to_string",
    # conversion
    "to_char", "to_number", "to_date", "to_timestamp", "date",
    # date/time (EXTRACT(...) is extract, AT TIME ZONE is timezone, OVERLAPS is overlaps)
    "now", "extract", "date_part", "date_trunc", "date_bin", "age", "make_date", "make_time", "make_timestamp",
    "make_timestamptz", "make_interval", "justify_days", "justify_hours", "justify_interval", "isfinite",
    "timezone", "overlaps", "statement_timestamp", "transaction_timestamp", "clock_timestamp",
    # conditional / nulls (COALESCE, NULLIF, GREATEST, LEAST and CASE are syntax)
    "num_nulls", "num_nonnulls",
    # arrays and JSON values (unnest is the one set-returning function: bounded by its input)
    "array_length", "cardinality", "array_position", "unnest", "json_array_length", "jsonb_array_length",
    "json_typeof", "jsonb_typeof", "json_extract_path_text", "jsonb_extract_path_text",
})
"""PostgreSQL functions a query may call, unqualified or as ``pg_catalog.<name>`` (exact names)."""

POSTGRES_TYPES: frozenset[str] = frozenset({
    "bool", "int2", "int4", "int8", "numeric", "float4", "float8", "text", "varchar", "bpchar", "date", "time",
    "timetz", "timestamp", "timestamptz", "interval", "uuid", "json", "jsonb",
    # the SQL spellings, as the parser leaves them when unqualified
    "boolean", "integer", "int", "smallint", "bigint", "decimal", "real", "float",
})
"""Types a PostgreSQL cast may name (``x::T``, ``CAST(x AS T)``, ``T 'literal'``): no ``reg*`` lookups."""

POSTGRES_OPERATORS: frozenset[str] = frozenset({
    # comparison, arithmetic, concatenation
    "=", "<>", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "^", "@", "|/", "||",
    # LIKE / ILIKE / regular expressions
    "~~", "!~~", "~~*", "!~~*", "~", "~*", "!~", "!~*", "^@",
    # bits
    "&", "|", "#", "<<", ">>",
    # JSON and arrays
    "->", "->>", "#>", "#>>", "@>", "<@", "?", "?|", "?&", "&&",
})
"""PostgreSQL operators a query may use, bare or as ``OPERATOR(pg_catalog.<op>)``."""

_PREFIX_FUNCTIONS: tuple[str, ...] = ("pg_sleep", "dblink", "pg_advisory_", "pg_try_advisory_", "lo_")
_EXACT_FUNCTIONS: frozenset[str] = frozenset({
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_file_write", "pg_terminate_backend",
    "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile", "pg_notify", "set_config", "nextval", "setval",
    "load_extension", "readfile", "writefile", "fts3_tokenizer", "edit", "sqlite_compileoption_get",
})
# fmt: on


def is_dangerous_function(name: str) -> bool:
    """Whether ``name`` (any case) is on the SQLite authorizer's blocklist (the second wall; the static check
    refuses every function off the allowlist, listed here or not)."""
    low = name.lower()
    return low in _EXACT_FUNCTIONS or low.startswith(_PREFIX_FUNCTIONS)
