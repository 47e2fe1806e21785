#!/usr/bin/env bash
# Start PostgreSQL and Redis on their default local ports if they are not answering, and
# PgBouncer (transaction pooling, 127.0.0.1:6432, in front of that PostgreSQL; installed
# with apt-get when missing and this runs as root) for flowy-postgres's pooler-mode tests.
set -u
pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

if command -v pg_ctlcluster >/dev/null 2>&1 && ! pg_up; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
if command -v redis-server >/dev/null 2>&1 && ! redis_up; then
  echo "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no || true
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
fi
if command -v psql >/dev/null 2>&1 && pg_up; then
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" postgres 2>/dev/null | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" postgres >/dev/null 2>&1 || true
fi
# PgBouncer: its config and logs live in $PGBOUNCER_DIR; it never runs as root.
PGBOUNCER_DIR=${PGBOUNCER_DIR:-/tmp/flowy-pgbouncer}
pgbouncer_up() { pg_isready -h 127.0.0.1 -p 6432 -q 2>/dev/null; }
if ! command -v pgbouncer >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing PgBouncer"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer; }; } >/dev/null 2>&1 \
    || echo "could not install PgBouncer: the pooler tests will fail under FLOWY_REQUIRE_BACKENDS=1" >&2
fi
if command -v pgbouncer >/dev/null 2>&1 && pg_up && ! pgbouncer_up; then
  echo "starting PgBouncer (transaction pooling) on 127.0.0.1:6432"
  mkdir -p "$PGBOUNCER_DIR"
  cat >"$PGBOUNCER_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
unix_socket_dir =
auth_type = trust
auth_file = $PGBOUNCER_DIR/users.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
logfile = $PGBOUNCER_DIR/pgbouncer.log
pidfile = $PGBOUNCER_DIR/pgbouncer.pid
INI
  echo '"postgres" ""' >"$PGBOUNCER_DIR/users.txt"
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$PGBOUNCER_DIR"
    su postgres -s /bin/sh -c "pgbouncer -d '$PGBOUNCER_DIR/pgbouncer.ini'" || true
  else
    pgbouncer -d "$PGBOUNCER_DIR/pgbouncer.ini" || true
  fi
  for _ in $(seq 1 30); do pgbouncer_up && break; sleep 1; done
fi
exit 0
