#!/bin/sh
# The streaming replica of docker-compose.scale.yml: on first start, a base backup of the
# primary through a replication slot of its own (so the primary keeps the WAL the replica has
# not replayed yet, as `concord stack up --pg-replica` does), then Postgres as a hot standby.
# The backup goes to a scratch directory first: one interrupted halfway is never started.
set -e
SLOT=concord_replica_compose
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  export PGPASSWORD="$POSTGRES_PASSWORD"
  until gosu postgres pg_isready -h postgres -U "$POSTGRES_USER" -d "$POSTGRES_DB"; do sleep 1; done
  # A slot left by an earlier replica (its volume since removed) is reused, not made again.
  exists=$(gosu postgres psql -h postgres -U "$POSTGRES_USER" -d "$POSTGRES_DB" -tAc \
    "SELECT 1 FROM pg_replication_slots WHERE slot_name = '$SLOT'")
  create_slot="-C"
  [ "$exists" = "1" ] && create_slot=""
  # Inside the volume (PGDATA is its mount point, which cannot itself be replaced).
  scratch="$PGDATA/.partial"
  rm -rf "$scratch" && mkdir -p "$scratch" && chown -R postgres:postgres "$PGDATA"
  gosu postgres pg_basebackup -h postgres -U "$POSTGRES_USER" -D "$scratch" -R -X stream \
    $create_slot -S "$SLOT"
  mv "$scratch"/* "$PGDATA"/ && rmdir "$scratch" && chmod 700 "$PGDATA"
fi
exec docker-entrypoint.sh postgres -c hot_standby=on
