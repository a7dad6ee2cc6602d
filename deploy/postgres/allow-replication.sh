#!/bin/sh
# Run once by the postgres image at initdb (docker-entrypoint-initdb.d): let the replica of
# docker-compose.scale.yml stream from this primary with the same password.
set -e
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
