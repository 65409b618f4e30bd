-- The least-privilege role the Text-to-SQL gateway (hexflow) connects to PostgreSQL as.
--
-- It can log in, connect to one database and read the tables and views of one schema: nothing else.
-- Every query it runs was written by a model, so the role is the last wall behind the gateway's SQL
-- check and its READ ONLY transactions. The gateway refuses a role that is a superuser, has BYPASSRLS,
-- CREATEROLE or REPLICATION, or is a member of pg_read_server_files, pg_write_server_files,
-- pg_execute_server_program, pg_signal_backend, pg_read_all_data, pg_write_all_data,
-- pg_read_all_settings, pg_read_all_stats or pg_monitor (gateway/text2sql/db/postgres.py, role_problems);
-- `hexflow databases --check FILE` says whether a configured role passes.
--
-- Run it once per database, as a superuser (temp_file_limit can only be set by one), with psql:
--
--   psql "postgresql://postgres@db.internal:5432/sales" -f deploy/postgres/reader-role.sql \
--     -v reader=hexflow_reader -v password='change-me' -v dbname=sales -v schema=public \
--     -v owner=sales_app -v statement_timeout=5s
--
-- reader             the role to create (then: url: postgresql://hexflow_reader:change-me@db.internal:5432/sales)
-- dbname, schema     the database and the one schema the gateway may read (databases file: schema: ...)
-- owner              the role that creates the schema's tables: tables it creates later are readable too
-- statement_timeout  the role's own timeout, a backstop behind the gateway's per-query SET LOCAL
--
-- The test fixtures of the project (tests/text2sql/conftest.py) run this very file, with the
-- variables substituted, to create the role every PostgreSQL test connects as.

\set ON_ERROR_STOP on

-- Login, no attribute beyond it, and no memberships (NOINHERIT: a role granted later by mistake
-- lends nothing without an explicit SET ROLE, which the gateway's check refuses anyway).
CREATE ROLE :"reader" LOGIN PASSWORD :'password'
  NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 32;

-- Nobody creates objects or temporary tables through PUBLIC's defaults in this database or schema.
REVOKE CREATE, TEMPORARY ON DATABASE :"dbname" FROM PUBLIC;
REVOKE CREATE ON SCHEMA :"schema" FROM PUBLIC;

-- CONNECT on the database, USAGE on the one schema, SELECT on its tables and views (not sequences),
-- now and for the tables the owner creates later. No grant on any other schema.
GRANT CONNECT ON DATABASE :"dbname" TO :"reader";
GRANT USAGE ON SCHEMA :"schema" TO :"reader";
GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"reader";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema" GRANT SELECT ON TABLES TO :"reader";

-- Session defaults: read-only, a statement timeout, no idle transaction held open, bounded temp files,
-- names resolved in the schema.
ALTER ROLE :"reader" SET default_transaction_read_only = on;
ALTER ROLE :"reader" SET statement_timeout = :'statement_timeout';
ALTER ROLE :"reader" SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE :"reader" SET temp_file_limit = '1GB';
ALTER ROLE :"reader" SET search_path = :"schema";

-- Other schemas: the role has no grant on them, but PUBLIC keeps USAGE on schema public by default and
-- sees any table granted to PUBLIC there. When the gateway's schema is not public and public holds data,
-- also run:  REVOKE ALL ON SCHEMA public FROM PUBLIC;
