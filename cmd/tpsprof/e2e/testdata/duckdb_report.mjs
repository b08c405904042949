// The report's figures computed by DuckDB from the same folders, with the
// SQL docs/parquet.md gives ("The report's figures in SQL"); warm-up is the
// first 2 steps (tpsprof report --warmup 2), one attempt.
import { DuckDBInstance } from '@duckdb/node-api';
const dir = process.argv[2];
const con = await (await DuckDBInstance.create(':memory:')).connect();
const one = async (q) => (await con.runAndReadAll(q)).getRowObjectsJson()[0];
const C = `'${dir}/cluster_steps/*.parquet'`, R = `'${dir}/rank_steps/*.parquet'`;
const out = {
  tps: await one(`select avg(tps) mean, quantile_cont(tps, 0.5) p50, quantile_cont(tps, 0.95) p95,
      quantile_cont(step_time_ns / 1e9, 0.5) step_p50, sum(tokens) / (sum(step_time_ns) / 1e9) aggregate_tps
    from ${C} where step >= 2 and ranks_missing = 0`),
  breakdown: await one(`select avg(compute_ns_mean / step_time_ns) compute, avg(comm_fraction_mean) exposed_comm,
      avg(wait_fraction_mean) waiting, avg(bubble_fraction_mean) bubble, avg(data_stall_fraction_mean) data_stall,
      avg(mfu) filter (where coalesce(mfu_unknown, '') = '') mfu
    from ${C} where step >= 2 and ranks_missing = 0`),
  straggler: await one(`with m as (select rank, median(duration_ns - exposed_comm_ns - data_wait_ns - pp_wait_ns - ckpt_ns) c
      from ${R} where step >= 2 group by rank)
    select rank, (select min(c) from m) / c score from m order by score, rank limit 1`),
};
console.log(JSON.stringify(out));
