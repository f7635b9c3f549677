#!/usr/bin/env bash
# Start a throwaway PostgreSQL on loopback for the session-tier tests.
# Prints two lines: its SQLAlchemy URL, then the command that stops it.
# Installs the server from Debian's packages when this machine lacks it.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGDATA=$(mktemp -d /tmp/chatcache-pg.XXXXXX)
# A free port unless one is named: a second CI on the same machine (a fresh clone beside
# another) must not find the first one's server on a fixed port and fail to start.
PORT=${CHATCACHE_PG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
chown postgres "$PGDATA"
su postgres -c "$PGBIN/initdb -D $PGDATA -A trust -U postgres" >/dev/null
su postgres -c "$PGBIN/pg_ctl -D $PGDATA -l $PGDATA/server.log -w -o '-p $PORT -k $PGDATA -c listen_addresses=127.0.0.1' start" >/dev/null
echo "postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"
echo "cd / && su postgres -c '$PGBIN/pg_ctl -D $PGDATA stop -m fast' >/dev/null; rm -rf $PGDATA"
