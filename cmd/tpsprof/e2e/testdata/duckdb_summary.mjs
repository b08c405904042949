// DuckDB's own reader computing what the report's summary holds (per-rank
// median compute, token sum and row count from rank_steps; TPS mean and
// quantiles from cluster_steps) over a job folder, timed from the
// instance's creation to the last result (node's start-up excluded).
import { DuckDBInstance } from '@duckdb/node-api';
const dir = process.argv[2];
const t0 = process.hrtime.bigint();
const con = await (await DuckDBInstance.create(':memory:')).connect();
const all = async (q) => (await con.runAndReadAll(q)).getRowObjectsJson();
const ranks = await all(`select rank, median(greatest(duration_ns - exposed_comm_ns - data_wait_ns - pp_wait_ns - ckpt_ns, 0)) m,
  sum(tokens) t, count(*) n from '${dir}/rank_steps/*.parquet' group by rank`);
const tps = await all(`select quantile_cont(tps, [0.5, 0.9, 0.95, 0.99]) q, avg(tps) m, count(*) n from '${dir}/cluster_steps/*.parquet'`);
const t1 = process.hrtime.bigint();
console.log(JSON.stringify({ ranks: ranks.length, steps: Number(tps[0].n), ms: Number(t1 - t0) / 1e6 }));
