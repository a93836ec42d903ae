"""The function allow-list (bot/sources/functions.py) through the guard: the queries analysts
run pass in each dialect, anything that calls a function off the list is refused naming it."""

from __future__ import annotations

import pytest
from sqlglot import expressions as exp

from bot.sources import functions
from bot.sources.guard import _DIALECTS, QueryRefused, check_query

#: What people run on PostgreSQL: none of it may be refused.
POSTGRES_READS = [
    "SELECT date_trunc('month', placed) AS month, sum(amount) FROM orders GROUP BY 1 ORDER BY 1",
    "SELECT extract(year FROM placed), extract(dow FROM placed), date_part('week', placed) FROM orders",
    "SELECT to_char(placed, 'YYYY-MM'), to_date('2024-01-05', 'YYYY-MM-DD'), to_timestamp(1700000000) FROM orders",
    "SELECT round(avg(amount), 2), round(amount::numeric, 1), ceil(amount), floor(amount), abs(-1) FROM orders",
    "SELECT coalesce(customer, 'n/a'), nullif(amount, 0), CASE WHEN paid THEN 'yes' ELSE 'no' END FROM orders",
    "SELECT string_agg(customer, ', ' ORDER BY customer), array_agg(DISTINCT id) FROM orders",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY amount), percentile_disc(0.9) WITHIN GROUP (ORDER BY amount) "
    "FROM orders",
    "SELECT mode() WITHIN GROUP (ORDER BY customer) FROM orders",
    "SELECT payload -> 'a', payload ->> 'b', payload #> '{a,b}', payload #>> '{a}', payload ? 'k' FROM events",
    "SELECT jsonb_array_elements(payload -> 'items') ->> 'sku' FROM events",
    "SELECT e.key, e.value FROM events, jsonb_each(payload) AS e",
    "SELECT * FROM jsonb_to_recordset('[{\"a\": 1}]'::jsonb) AS x(a int)",
    "SELECT json_build_object('id', id, 'total', amount), to_jsonb(o) FROM orders o",
    "SELECT regexp_replace(customer, '[^a-z]', '', 'g'), lower(customer), upper(customer), initcap(customer) "
    "FROM orders",
    "SELECT substr(customer, 1, 2), substring(customer FROM 2), left(customer, 1), length(customer), "
    "trim(customer), split_part(customer, '@', 2), position('a' IN customer), strpos(customer, 'a') FROM orders",
    "SELECT customer || '!' , concat(customer, id), concat_ws('-', customer, id), lpad(id::text, 5, '0') FROM orders",
    "SELECT customer ~ '^a', customer ~* 'A', customer LIKE 'a%', customer ILIKE 'A%', customer SIMILAR TO 'a%' "
    "FROM orders",
    "SELECT cast(amount AS integer), amount::text, placed::timestamp, '2024-01-01'::date + interval '1 day' "
    "FROM orders",
    "SELECT now(), current_date, current_timestamp, localtimestamp, clock_timestamp(), age(now(), placed) FROM orders",
    "SELECT g::date FROM generate_series('2024-01-01'::date, '2024-12-31', interval '1 month') AS g",
    "SELECT n FROM generate_series(1, 10) AS n",
    "SELECT customer, row_number() OVER (PARTITION BY customer ORDER BY placed), "
    "rank() OVER w, dense_rank() OVER w, lag(amount) OVER w, lead(amount, 2) OVER w, "
    "sum(amount) OVER (ORDER BY placed ROWS BETWEEN 6 PRECEDING AND CURRENT ROW), "
    "ntile(4) OVER w, first_value(amount) OVER w, percent_rank() OVER w FROM orders WINDOW w AS (ORDER BY amount)",
    "SELECT count(DISTINCT customer), count(*) FILTER (WHERE paid), bool_and(paid), bool_or(paid) FROM orders",
    "SELECT stddev(amount), variance(amount), corr(amount, id), min(placed), max(placed) FROM orders",
    "SELECT greatest(1, 2), least(1, 2), power(2, 10), sqrt(2), ln(2), log(100), exp(1), mod(7, 3), "
    "width_bucket(amount, 0, 100, 10), random() FROM orders",
    "SELECT unnest(ARRAY[1, 2, 3]), array_length(ARRAY[1], 1), cardinality(ARRAY[1]), 1 = ANY(ARRAY[1])",
    "SELECT x FROM unnest(ARRAY[1, 2]) AS u(x)",
    "WITH monthly AS (SELECT date_trunc('month', placed) AS m, sum(amount) AS total FROM orders GROUP BY 1) "
    "SELECT m, total, total - lag(total) OVER (ORDER BY m) AS change FROM monthly",
    "SELECT * FROM orders WHERE placed >= now() - interval '30 days' AND customer IN (SELECT customer FROM orders)",
    "SELECT EXISTS (SELECT 1 FROM orders WHERE paid)",
    "SELECT customer FROM orders GROUP BY ROLLUP (customer)",
    "SELECT md5(customer), encode(sha256(customer::bytea), 'hex'), to_hex(id) FROM orders",
    "SELECT to_tsvector('english', customer) @@ plainto_tsquery('ada') FROM orders",
    "SELECT date_bin('15 minutes', placed, '2024-01-01'), justify_interval(interval '40 days') FROM orders",
    "SELECT * FROM orders TABLESAMPLE BERNOULLI (10) REPEATABLE (1)",
    "SELECT * FROM orders TABLESAMPLE SYSTEM (5)",
    "SELECT pg_typeof(amount), pg_size_pretty(1024::bigint) FROM orders",
    "SELECT format('%s has %s', customer, id), quote_ident(customer), reverse(customer), repeat('x', 3) FROM orders",
    "SELECT make_date(2024, 1, 1), to_number('12.5', '99.9'), trunc(1.55, 1), sign(-2) FROM orders",
    "SELECT current_user, current_database(), pg_sleep(0)",
    "SELECT (jsonb_each(payload)).key FROM events",
]

SQLITE_READS = [
    "SELECT strftime('%Y-%m', placed) AS month, sum(amount) FROM orders GROUP BY 1",
    "SELECT date(placed), datetime(placed, '+1 day'), julianday(placed), unixepoch(placed) FROM orders",
    "SELECT round(avg(amount), 2), total(amount), count(DISTINCT customer), group_concat(customer, ', ') FROM orders",
    "SELECT coalesce(customer, 'n/a'), ifnull(amount, 0), nullif(amount, 0), iif(paid, 'yes', 'no') FROM orders",
    "SELECT substr(customer, 1, 2), lower(customer), upper(customer), length(customer), trim(customer), "
    "replace(customer, 'a', 'b'), instr(customer, 'a'), printf('%05d', id) FROM orders",
    "SELECT json_extract(payload, '$.a'), payload -> '$.b', payload ->> '$.c', json_array_length(payload) FROM events",
    "SELECT j.value FROM events, json_each(events.payload) AS j",
    "SELECT cast(amount AS integer), typeof(amount), abs(amount), max(amount, 1), min(amount, 1) FROM orders",
    "SELECT customer, row_number() OVER (PARTITION BY customer ORDER BY placed), "
    "lag(amount) OVER (ORDER BY placed), sum(amount) OVER (ORDER BY placed) FROM orders",
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 10) SELECT x FROM n",
    "SELECT customer FROM orders WHERE customer GLOB 'a*' OR customer LIKE 'b%'",
    "SELECT hex(id), quote(customer), random(), date('now'), CURRENT_TIMESTAMP FROM orders",
    "SELECT CASE WHEN amount > 10 THEN 'big' ELSE 'small' END, amount % 3 FROM orders",
]

#: (query, the function named in the refusal), PostgreSQL.
POSTGRES_REFUSED = [
    ("SELECT lo_from_bytea(0, 'x') FROM generate_series(1, 50)", "lo_from_bytea()"),
    ("SELECT lo_import('/etc/passwd')", "lo_import()"),
    ("SELECT lo_export(16385, '/tmp/x')", "lo_export()"),
    ("SELECT lo_create(0)", "lo_create()"),
    ("SELECT lo_unlink(16385)", "lo_unlink()"),
    ("SELECT dblink_exec('dbname=shop', 'DELETE FROM orders')", "dblink_exec()"),
    ("SELECT * FROM dblink('dbname=shop', 'SELECT 1') AS t(a int)", "dblink()"),
    ("SELECT dblink_connect('c', 'dbname=shop')", "dblink_connect()"),
    ("SELECT pg_read_file('/etc/passwd')", "pg_read_file()"),
    ("SELECT pg_read_binary_file('postgresql.conf')", "pg_read_binary_file()"),
    ("SELECT * FROM pg_ls_dir('.')", "pg_ls_dir()"),
    ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity", "pg_terminate_backend()"),
    ("SELECT pg_cancel_backend(1)", "pg_cancel_backend()"),
    ("SELECT pg_reload_conf()", "pg_reload_conf()"),
    ("SELECT pg_advisory_lock(1)", "pg_advisory_lock()"),
    ("SELECT pg_notify('c', 'x')", "pg_notify()"),
    ("SELECT pg_create_logical_replication_slot('s', 'test_decoding')", "pg_create_logical_replication_slot()"),
    ("SELECT set_config('statement_timeout', '0', false)", "set_config()"),
    ("SELECT current_setting('data_directory')", "current_setting()"),
    ("SELECT nextval('orders_id_seq')", "nextval()"),
    ("SELECT setval('orders_id_seq', 1)", "setval()"),
    ("SELECT currval('orders_id_seq')", "currval()"),
    ("SELECT query_to_xml('DELETE FROM orders RETURNING 1', true, true, '')", "query_to_xml()"),
    ("SELECT * FROM ts_stat('SELECT lo_from_bytea(0, ''x'')::text::tsvector')", "ts_stat()"),
    ("SELECT txid_current()", "txid_current()"),
    ("SELECT uuid_generate_v4()", "uuid_generate_v4()"),
    ("SELECT some_unknown_function(1)", "some_unknown_function()"),
    ("SELECT count(*) FROM orders WHERE id = lo_from_bytea(0, 'x')::int", "lo_from_bytea()"),
    ("WITH x AS (SELECT lo_from_bytea(0, 'x') AS o) SELECT * FROM x", "lo_from_bytea()"),
    ("SELECT (SELECT max(lo_create(0)) FROM orders)", "lo_create()"),
    ("SELECT public.lower(customer) FROM orders", "public.lower()"),
    ("SELECT pg_catalog.pg_read_file('/etc/passwd')", "pg_catalog.pg_read_file()"),
    # A table function's schema is its table's: an allowed name in another schema is another function.
    ("SELECT * FROM evil.json_each('{}')", "evil.json_each()"),
    ("SELECT * FROM ROWS FROM (evil.json_each('{}'))", "evil.json_each()"),
    ("SELECT * FROM evil.generate_series(1, 2)", "a function named with its schema"),
    ("SELECT \"LO_FROM_BYTEA\"(0, 'x')", "LO_FROM_BYTEA()"),
    ("SELECT 1 OPERATOR(pg_catalog.+) 1", "OPERATOR("),
    ("SELECT * FROM orders TABLESAMPLE evil_method (10)", "evil_method"),
]


@pytest.mark.parametrize("query", POSTGRES_READS)
def test_what_analysts_run_on_postgres_passes(query: str) -> None:
    check_query(query, "postgres")


@pytest.mark.parametrize("query", SQLITE_READS)
def test_what_analysts_run_on_sqlite_passes(query: str) -> None:
    check_query(query, "sqlite")


@pytest.mark.parametrize(("query", "named"), POSTGRES_REFUSED)
def test_calls_off_the_list_are_refused_naming_the_function(query: str, named: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        check_query(query, "postgres")
    assert named in str(refused.value), str(refused.value)


def test_the_refusal_is_one_sentence_saying_it_is_not_on_the_list() -> None:
    with pytest.raises(QueryRefused) as refused:
        check_query("SELECT lo_from_bytea(0, 'x') FROM generate_series(1, 50)", "postgres")
    assert str(refused.value) == "it calls lo_from_bytea(), which is not on the list of functions a query may call"


@pytest.mark.parametrize(
    ("query", "dialect", "named"),
    [
        ("SELECT load_extension('/tmp/evil.so')", "sqlite", "load_extension()"),
        ("SELECT fts3_tokenizer('simple')", "sqlite", "fts3_tokenizer()"),
        ("SELECT zeroblob(1000000000)", "sqlite", "zeroblob()"),
        ("SELECT randomblob(1000000000)", "sqlite", "randomblob()"),
        ("SELECT writefile('/tmp/x', 'y')", "sqlite", "writefile()"),
        ("SELECT sleep(10)", "mysql", "sleep()"),
        ("SELECT benchmark(1000000, md5('x'))", "mysql", "benchmark()"),
        ("SELECT load_file('/etc/passwd')", "mysql", "load_file()"),
        ("SELECT * FROM read_csv('/etc/passwd')", "duckdb", "read_csv()"),
        ("SELECT * FROM glob('/etc/*')", "duckdb", "glob()"),
        ("SELECT * FROM OPENROWSET('SQLNCLI', 'x', 'SELECT 1')", "tsql", "openrowset()"),
        ("SELECT system$cancel_all_queries(1)", "snowflake", "system$cancel_all_queries()"),
    ],
)
def test_other_dialects_refuse_their_own_dangerous_functions(query: str, dialect: str, named: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        check_query(query, dialect)
    assert named in str(refused.value).lower(), str(refused.value)


@pytest.mark.parametrize("dialect", sorted(set(_DIALECTS.values())))
def test_every_dialect_refuses_large_objects_and_unknown_functions(dialect: str) -> None:
    for query in ["SELECT lo_from_bytea(0, 'x')", "SELECT dblink_exec('x', 'y')", "SELECT nextval('s')"]:
        with pytest.raises(QueryRefused, match="not on the list"):
            check_query(query, dialect)


@pytest.mark.parametrize("dialect", sorted(set(_DIALECTS.values())))
def test_every_dialect_passes_a_plain_aggregate(dialect: str) -> None:
    check_query("SELECT customer, count(*), sum(amount), max(amount) FROM orders GROUP BY customer", dialect)


def test_every_listed_node_is_a_function_class_of_this_sqlglot() -> None:
    listed = functions.listed_node_names()
    assert [name for name in listed if not hasattr(exp, name)] == []  # a typo, or sqlglot renamed it
    assert [name for name in listed if not issubclass(getattr(exp, name), exp.Func)] == []
    assert len(functions.ALLOWED_NODES) == len(set(listed))


def test_names_are_lower_case_and_nothing_dangerous_is_listed() -> None:
    names = functions.ALLOWED_NAMES
    assert all(name == name.lower() for name in names)
    dangerous = ("lo_", "dblink", "set_config", "current_setting", "nextval", "setval", "currval", "query_to_xml")
    assert [name for name in names if name.startswith(dangerous)] == []
    assert sorted(name for name in names if name.startswith("pg_")) == ["pg_size_pretty", "pg_sleep", "pg_typeof"]


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM 'orders.csv'",
        'SELECT * FROM "/etc/passwd"',
        "SELECT count(*) FROM 's3://bucket/*.parquet'",
        "SELECT * FROM orders.csv",  # unquoted: DuckDB joins the parts, schema "orders", table "csv"
        "SELECT * FROM logs.today.json.gz",
        'SELECT * FROM "orders.csv.bz2"',
    ],
)
def test_duckdb_refuses_a_table_it_would_read_from_a_file(query: str) -> None:
    """DuckDB reads a table named like a file, path or URL from the server's disk or network
    (a replacement scan, no function called): refused like a file function."""
    with pytest.raises(QueryRefused, match="DuckDB takes from a file"):
        check_query(query, "duckdb")
    check_query("SELECT * FROM sales.orders o JOIN main.items i ON o.id = i.id", "duckdb")
