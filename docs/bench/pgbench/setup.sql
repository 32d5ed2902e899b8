DROP SCHEMA IF EXISTS pgb CASCADE;
CREATE SCHEMA pgb;
CREATE SEQUENCE pgb.fence AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE pgb.leases (name text PRIMARY KEY, owner text,
  token bigint NOT NULL UNIQUE DEFAULT nextval('pgb.fence'::regclass),
  acquired_at timestamptz, expires_at timestamptz, note text,
  CHECK ((owner IS NULL) = (expires_at IS NULL) AND (owner IS NULL) = (acquired_at IS NULL)));
CREATE TABLE pgb.nu (name text PRIMARY KEY, owner text,
  token bigint NOT NULL DEFAULT nextval('pgb.fence'::regclass),
  acquired_at timestamptz, expires_at timestamptz, note text,
  CHECK ((owner IS NULL) = (expires_at IS NULL) AND (owner IS NULL) = (acquired_at IS NULL)));
CREATE TABLE pgb.floor (name text PRIMARY KEY, v bigint);
