// The rank_windows query docs/parquet.md gives, beside the same figure from
// rank_steps, both with DuckDB: each rank's mean compute per window.
import { DuckDBInstance } from '@duckdb/node-api';
const dir = process.argv[2];
const con = await (await DuckDBInstance.create(':memory:')).connect();
const all = async (q) => (await con.runAndReadAll(q)).getRowObjectsJson();
const out = {
  windows: await all(`select attempt, rank, window_index, sum(compute_ns.sum) / sum(steps) as compute_ns_mean
from '${dir}/rank_windows/*.parquet' group by all order by window_index, rank`),
  steps: await all(`select attempt, rank, step // 100 as window_index,
  avg(greatest(duration_ns - exposed_comm_ns - data_wait_ns - pp_wait_ns - ckpt_ns, 0)) as compute_ns_mean
from '${dir}/rank_steps/*.parquet' group by all order by window_index, rank`),
};
console.log(JSON.stringify(out));
