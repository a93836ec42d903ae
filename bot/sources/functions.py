"""The functions a query may call: one allow-list, checked on sqlglot's tree before anything is sent.

A ``SELECT`` can still write (PostgreSQL's ``lo_from_bytea`` makes large objects in a
``READ ONLY`` transaction, ``dblink_exec`` runs a statement in another session), read files
(``pg_read_file``, DuckDB's ``read_csv``), wait, lock, signal other backends or change
settings: through the functions it calls. So a query passes only when every function in it is
on this list of side-effect-free ones, what analysis needs: aggregates, window functions,
arithmetic and maths, strings and regular expressions, dates and times, casts, conditionals,
arrays, JSON accessors and builders, full-text search, series generators. Anything else,
known to be harmful or merely unknown, is refused with one sentence naming it.

sqlglot parses the functions it knows into typed nodes (``exp.Sum``, ``exp.Lower``) and the
others into ``exp.Anonymous`` with the name as written. So there are two lists:

- :data:`ALLOWED_NODES`: the typed function classes (``exp.Func`` subclasses, ``AND``/``OR``
  included) a query may hold; the exact class, a subclass is not implied.
- :data:`ALLOWED_NAMES`: the lower-cased names a function sqlglot does not type may have, in
  any dialect (so none is here that does harm in one of them: DuckDB's ``glob`` lists files).
  A quoted name must be written in lower case (``"Lower"(x)`` names another function in
  PostgreSQL).

And beside them:

- a function named with its schema (``public.lower(x)``, ``pg_catalog.pg_read_file(…)``) is
  refused: the list names built-ins, and a schema can hold anything under any name;
- ``OPERATOR(schema.op)`` is refused (an operator is a function under another name; the
  built-in operators parse as typed nodes of their own and are not functions);
- ``TABLESAMPLE`` takes the built-in methods only (a sampling method is a function too).

``pg_sleep`` is on the list: it writes nothing, and ``statement_timeout_s`` ends it like any
slow query (refusing it would buy nothing: ``count(*)`` over a large ``generate_series``
holds a connection as long, and burns the database's CPU besides).

Deliberately left off (unknown means refused): ``current_setting`` and ``set_config``
(server settings are no data), sequence functions, advisory locks, ``pg_notify``, functions
that run a query given as text (``query_to_xml``, ``ts_stat``, ``ts_rewrite``), XML parsing,
random blobs (``randomblob``, ``zeroblob``), SQLite's ``load_extension`` and
``fts3_tokenizer``, MySQL's ``sleep``/``benchmark``/``load_file``, every ``pg_*``
function but ``pg_typeof``, ``pg_size_pretty`` and ``pg_sleep``. docs/security.md says what this list can
and cannot promise (a function someone created in the database under an allowed name, or an
overload of one, runs too): the database role is the wall behind it.
"""

from __future__ import annotations

from sqlglot import expressions as exp

#: The typed sqlglot function nodes a query may hold, by what they are for.
_NODE_NAMES: dict[str, tuple[str, ...]] = {
    "logic and conditionals": (
        "And", "Or", "Xor", "Case", "If", "Coalesce", "Nullif", "Nvl2", "Greatest", "Least",
        "EqualNull", "DecodeCase", "Exists", "Try", "Booland", "Boolor", "Boolnot", "Columns",
    ),
    "aggregates": (
        "Count", "CountIf", "Sum", "Avg", "Min", "Max", "AnyValue", "ArrayAgg", "ArrayConcatAgg",
        "ArrayUniqueAgg", "ArrayUnionAgg", "GroupConcat", "Stddev", "StddevPop", "StddevSamp",
        "Variance", "VariancePop", "Corr", "CovarPop", "CovarSamp", "Median", "Mode",
        "PercentileCont", "PercentileDisc", "Quantile", "ApproxDistinct", "ApproxQuantile",
        "ApproxQuantiles", "ApproxTopK", "ArgMax", "ArgMin", "First", "Last", "BitwiseAndAgg",
        "BitwiseOrAgg", "BitwiseXorAgg", "LogicalAnd", "LogicalOr", "Kurtosis", "Skewness",
        "RegrAvgx", "RegrAvgy", "RegrCount", "RegrIntercept", "RegrR2", "RegrSlope", "RegrSxx",
        "RegrSxy", "RegrSyy", "RegrValx", "RegrValy", "Grouping", "GroupingId", "JSONArrayAgg",
        "JSONBObjectAgg", "JSONObjectAgg", "ObjectAgg",
    ),
    "window functions": (
        "RowNumber", "Rank", "DenseRank", "PercentRank", "CumeDist", "Ntile", "Lag", "Lead",
        "FirstValue", "LastValue", "NthValue",
    ),
    "arithmetic and maths": (
        "Abs", "Ceil", "Floor", "Round", "Trunc", "Rint", "Sign", "Sqrt", "Cbrt", "Exp", "Ln", "Log",
        "Pow", "Degrees", "Radians", "Pi", "Sin", "Cos", "Tan", "Cot", "Sec", "Csc", "Asin", "Acos",
        "Atan", "Atan2", "Sinh", "Cosh", "Tanh", "Coth", "Sech", "Csch", "Asinh", "Acosh", "Atanh",
        "Factorial", "IsInf", "IsNan", "Nanvl", "WidthBucket", "RangeBucket", "Rand", "Randn",
        "SafeAdd", "SafeDivide", "SafeMultiply", "SafeNegate", "SafeSubtract", "BitwiseCount",
        "Getbit",
    ),
    "strings and regular expressions": (
        "Lower", "Upper", "Initcap", "Length", "ByteLength", "BitLength", "Concat", "ConcatWs",
        "Substring", "SubstringIndex", "Left", "Right", "Trim", "Pad", "Replace", "Translate",
        "Reverse", "Repeat", "Space", "StrPosition", "SplitPart", "Split", "StringToArray",
        "Ascii", "Chr", "Unicode", "Overlay", "Format", "Stuff", "Normalize", "Collate",
        "Levenshtein", "Soundex", "JarowinklerSimilarity", "StartsWith", "EndsWith", "Contains",
        "RegexpLike", "RegexpILike", "RegexpReplace", "RegexpExtract", "RegexpExtractAll",
        "RegexpSubstr", "RegexpCount", "RegexpInstr", "RegexpSplit", "RegexpFullMatch",
        "MatchAgainst", "MD5", "MD5Digest", "SHA", "SHA2", "SHA1Digest", "SHA2Digest", "Hex", "LowerHex", "Unhex",
        "Encode", "Decode", "ToBase64", "FromBase64", "Base64Encode", "Base64DecodeString",
        "Base64DecodeBinary", "ToChar", "NumberToStr", "ToNumber", "ParseUrl",
    ),
    "dates and times": (
        "CurrentDate", "CurrentTime", "CurrentTimestamp", "CurrentDatetime", "CurrentTimestampLTZ",
        "CurrentTimezone", "Localtime", "Localtimestamp", "UtcDate", "UtcTime", "UtcTimestamp",
        "Systimestamp", "DateTrunc", "TimestampTrunc", "DatetimeTrunc", "TimeTrunc", "Extract",
        "DateAdd", "DateSub", "DateDiff", "DatetimeAdd", "DatetimeSub", "DatetimeDiff",
        "TimestampAdd", "TimestampSub", "TimestampDiff", "TimeAdd", "TimeSub", "TimeDiff", "DateBin",
        "Date", "Datetime", "Time", "Timestamp", "TimeToStr", "StrToTime", "StrToDate", "StrToUnix",
        "TimeStrToDate", "TimeStrToTime", "TimeStrToUnix", "TimeToTimeStr", "TimeToUnix",
        "UnixToStr", "UnixToTime", "UnixToTimeStr", "UnixDate", "UnixSeconds", "UnixMillis",
        "UnixMicros", "DateFromParts", "TimeFromParts", "TimestampFromParts", "DateStrToDate",
        "DateToDateStr", "DateFromUnixDate", "TsOrDsAdd", "TsOrDsDiff", "TsOrDsToDate",
        "TsOrDsToDateStr", "TsOrDsToDatetime", "TsOrDsToTime", "TsOrDsToTimestamp", "Day",
        "DayOfMonth", "DayOfWeek", "DayOfWeekIso", "DayOfYear", "Dayname", "Month", "Monthname",
        "Quarter", "Year", "Week", "WeekOfYear", "YearOfWeek", "YearOfWeekIso", "Hour", "Minute",
        "Second", "LastDay", "AddMonths", "MonthsBetween", "NextDay", "PreviousDay", "MakeInterval",
        "JustifyDays", "JustifyHours", "JustifyInterval", "ConvertTimezone", "ParseDatetime",
        "ParseTime", "TimeSlice",
    ),
    "casts and types": (
        "Cast", "TryCast", "CastToStrType", "JSONCast", "Convert", "ToDouble", "ToBoolean", "Typeof",
    ),
    "JSON": (
        "JSONExtract", "JSONExtractScalar", "JSONBExtract", "JSONBExtractScalar", "JSONBContains",
        "JSONBExists", "JSONBContainsAllTopKeys", "JSONBContainsAnyTopKeys", "JSONBContainsTopKey",
        "JSONBPathExists", "JSONExists", "JSONExtractArray", "JSONArray", "JSONObject", "JSONFormat",
        "JSONKeys", "JSONType", "JSONArrayContains", "ParseJSON", "JSONStripNulls", "JSONValueArray",
        "JSONTable", "OpenJSON", "JSONSet", "JSONRemove", "JSONArrayAppend", "JSONArrayInsert",
        "JSONBDeleteAtPath", "StructExtract",
    ),
    "arrays, maps and structs": (
        "Array", "ArrayContains", "ArrayContainsAll", "ArrayContainedBy", "ArrayOverlaps",
        "ArraySize", "ArrayToString", "ArrayConcat", "ArrayAppend", "ArrayPrepend", "ArrayPosition",
        "ArrayRemove", "ArraySlice", "ArraySort", "ArrayDistinct", "ArrayFilter", "ArrayAll",
        "ArrayAny", "ArrayFirst", "ArrayLast", "ArrayMax", "ArrayMin", "ArraySum", "ArrayReverse",
        "ArrayIntersect", "ArrayExcept", "ArrayCompact", "ArraysZip", "Transform", "Reduce",
        "Struct", "Map", "VarMap", "MapKeys", "MapSize", "MapContainsKey", "ToArray",
    ),
    "rows from values (table functions)": (
        "Unnest", "Explode", "Posexplode", "Flatten", "GenerateSeries", "ExplodingGenerateSeries",
        "GenerateDateArray", "GenerateTimestampArray",
    ),
    "who and where (read-only facts)": ("CurrentUser", "SessionUser", "CurrentSchema", "CurrentDatabase", "Uuid"),
}  # fmt: skip

#: Typed function nodes whose name decides (sqlglot keeps the name as written).
NAMED_NODES: tuple[type[exp.Func], ...] = (
    exp.Anonymous,
    exp.AnonymousAggFunc,
    exp.CombinedAggFunc,
    exp.ParameterizedAgg,
    exp.CombinedParameterizedAgg,
)

#: The names of functions sqlglot does not type, allowed in every dialect.
_NAMES: dict[str, tuple[str, ...]] = {
    "dates and times": (
        "age", "date_part", "to_timestamp", "to_date", "make_date", "make_time", "make_timestamp",
        "make_timestamptz", "make_interval", "clock_timestamp", "statement_timestamp",
        "transaction_timestamp", "timeofday", "isfinite", "date_subtract", "timezone", "now",
        "julianday", "unixepoch", "strftime", "datetime", "date", "time", "timediff",
        "date_format", "str_to_date", "from_unixtime", "unix_timestamp", "curdate", "curtime",
        "weekday", "dayofweek", "dayofmonth", "dayofyear",
    ),
    "strings": (
        "btrim", "ltrim", "rtrim", "lpad", "rpad", "strpos", "octet_length", "char_length",
        "character_length", "quote_ident", "quote_literal", "quote_nullable", "to_hex", "sha224",
        "sha256", "sha384", "sha512", "convert_from", "convert_to", "regexp_match",
        "regexp_matches", "regexp_split_to_array", "regexp_split_to_table", "string_to_table",
        "unistr", "casefold", "printf", "format", "instr", "hex", "unhex", "quote", "char", "unicode",
        "substr", "mid", "locate", "ifnull", "iif", "text",
    ),
    "maths": ("gcd", "lcm", "scale", "min_scale", "trim_scale", "erf", "erfc", "random_normal", "sind", "cosd", "log2", "div"),
    "aggregates": ("bit_and", "bit_or", "bit_xor", "bool_and", "bool_or", "every", "total", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg", "json_group_array", "json_group_object", "median"),
    "conditionals": ("num_nonnulls", "num_nulls", "likely", "unlikely", "likelihood", "nvl", "decode"),
    "arrays and ranges": (
        "cardinality", "array_dims", "array_fill", "array_lower", "array_upper", "array_ndims",
        "array_positions", "array_replace", "trim_array", "generate_subscripts", "isempty",
        "lower_inc", "upper_inc", "lower_inf", "upper_inf", "range_merge", "int4range",
        "int8range", "numrange", "tsrange", "tstzrange", "daterange", "generate_series",
    ),
    "JSON": (
        "json", "json_array", "json_array_elements", "json_array_elements_text", "json_array_length",
        "json_build_array", "json_build_object", "json_each", "json_each_text", "json_extract_path",
        "json_extract_path_text", "json_object", "json_object_keys", "json_populate_record",
        "json_populate_recordset", "json_to_record", "json_to_recordset", "json_typeof",
        "json_strip_nulls", "json_scalar", "json_serialize", "jsonb_array_elements",
        "jsonb_array_elements_text", "jsonb_array_length", "jsonb_build_array", "jsonb_build_object",
        "jsonb_each", "jsonb_each_text", "jsonb_extract_path", "jsonb_extract_path_text",
        "jsonb_insert", "jsonb_object", "jsonb_object_keys", "jsonb_path_exists", "jsonb_path_match",
        "jsonb_path_query", "jsonb_path_query_array", "jsonb_path_query_first",
        "jsonb_populate_record", "jsonb_populate_recordset", "jsonb_pretty", "jsonb_set",
        "jsonb_set_lax", "jsonb_strip_nulls", "jsonb_to_record", "jsonb_to_recordset",
        "jsonb_typeof", "row_to_json", "array_to_json", "to_json", "to_jsonb", "json_extract",
        "json_valid", "json_type", "json_insert", "json_patch", "json_remove", "json_replace",
        "json_set", "json_quote", "json_tree", "json_unquote", "json_contains", "json_length",
    ),
    "full-text search": (
        "to_tsvector", "to_tsquery", "plainto_tsquery", "phraseto_tsquery", "websearch_to_tsquery",
        "ts_rank", "ts_rank_cd", "ts_headline", "setweight", "strip", "array_to_tsvector",
        "tsvector_to_array", "ts_delete", "numnode", "querytree",
    ),
    "network addresses": ("abbrev", "broadcast", "family", "masklen", "netmask", "network", "inet_same_family", "inet_merge", "host", "hostmask"),
    "types and sizes": ("pg_typeof", "pg_size_pretty", "typeof"),
    "waiting (bounded by statement_timeout_s)": ("pg_sleep",),
    "who and where": ("user", "current_database", "current_schema", "current_user", "session_user"),
}  # fmt: skip

#: ``TABLESAMPLE`` methods (lower case) a query may name.
SAMPLE_METHODS = frozenset({"bernoulli", "system", "system_rows", "system_time", "block", "row", "rows", "reservoir"})

ALLOWED_NODES: frozenset[type[exp.Expr]] = frozenset(
    getattr(exp, name) for names in _NODE_NAMES.values() for name in names if hasattr(exp, name)
)
ALLOWED_NAMES: frozenset[str] = frozenset(name for names in _NAMES.values() for name in names)


def listed_node_names() -> list[str]:
    """Every class name on :data:`ALLOWED_NODES`'s list, also those this sqlglot lacks (for tests)."""
    return [name for names in _NODE_NAMES.values() for name in names]


def refusal(tree: exp.Expr, dialect: str) -> str | None:
    """Why ``tree`` (one parsed statement, sqlglot ``dialect``) calls something it may not, in
    one sentence (``it calls lo_from_bytea(), …``); None when every function in it is allowed."""
    for node in tree.walk():
        if isinstance(node, exp.Operator):
            return (
                f"it uses {node.sql(dialect=dialect or None)[:80]}: an operator named through OPERATOR() "
                "is a function that is not on the list of functions a query may call; use the plain operator"
            )
        if isinstance(node, exp.TableSample):
            method = node.args.get("method")
            if method is not None and method.name.lower() not in SAMPLE_METHODS:
                return (
                    f"its TABLESAMPLE method {method.name.lower()[:80]}() is not one of "
                    f"{', '.join(sorted(SAMPLE_METHODS))}"
                )
            continue
        if not isinstance(node, exp.Func):
            continue
        name = function_name(node)
        if (qualifier := _schema_of(node, dialect)) is not None:
            qualified = f"{qualifier}.{name}"
            return (
                f"it calls {qualified[:80]}(), a function named with its schema; "
                "only built-in functions by their plain names may be called"
            )
        if isinstance(node, NAMED_NODES):
            if not _named_allowed(node):
                return f"it calls {name[:80]}(), which is not on the list of functions a query may call"
        elif type(node) not in ALLOWED_NODES:
            return f"it calls {name[:80]}(), which is not on the list of functions a query may call"
    return None


def _schema_of(node: exp.Func, dialect: str) -> str | None:
    """The schema (and catalog) ``node`` is called with (``pg_catalog.now()``, ``FROM
    evil.json_each(…)``: a table function's schema is its table's), None for a plain name."""
    parent = node.parent
    if isinstance(parent, exp.Dot) and node.arg_key == "expression":
        return str(parent.this.sql(dialect=dialect or None))
    if (
        isinstance(parent, exp.Table)
        and node.arg_key == "this"
        and (parent.args.get("db") or parent.args.get("catalog"))
    ):
        return ".".join(part.sql(dialect=dialect or None) for part in parent.parts[:-1])
    return None


def function_name(node: exp.Func) -> str:
    """The name of the function ``node`` calls, lower-cased (as written, for untyped ones)."""
    if isinstance(node, NAMED_NODES):
        this = node.this
        if isinstance(this, exp.Expr):
            return this.name.lower() if not _quoted(node) else this.name
        return str(this).lower()
    return type(node).sql_names()[0].lower()


def _quoted(node: exp.Func) -> bool:
    this = node.this
    return isinstance(this, exp.Identifier) and bool(this.args.get("quoted"))


def _named_allowed(node: exp.Func) -> bool:
    name = function_name(node)
    return name == name.lower() and name in ALLOWED_NAMES  # a quoted name in another case: not a built-in
