// The report's figures computed by DuckDB from the same folders, with the
// SQL docs/parquet.md gives ("The report's figures in SQL"); warm-up is the
// first 2 steps (tpsprof report --warmup 2), one attempt.
import { DuckDBInstance } from '@duckdb/node-api';
const dir = process.argv[2];
const con = await (await DuckDBInstance.create(':memory:')).connect();
const one = async (q) => (await con.runAndReadAll(q)).getRowObjectsJson()[0];
const C = `'${dir}/cluster_steps/*.parquet'`, R = `'${dir}/rank_steps/*.parquet'`;
const out = {
  tps: await one(`select sum(tokens) / (sum(step_time_ns) / 1e9) aggregate_tps, quantile_cont(tps, 0.5) p50, quantile_cont(tps, 0.95) p95,
      quantile_cont(step_time_ns / 1e9, 0.5) step_p50
    from ${C} where step >= 2 and ranks_missing = 0`),
  breakdown: await one(`select sum(least(compute_ns_mean / step_time_ns, 1 - comm_fraction_mean - wait_fraction_mean - bubble_fraction_mean
          - data_stall_fraction_mean - ckpt_fraction_mean) * step_time_ns) / sum(step_time_ns) compute,
      sum(comm_fraction_mean * step_time_ns) / sum(step_time_ns) exposed_comm,
      sum(wait_fraction_mean * step_time_ns) / sum(step_time_ns) waiting,
      sum(bubble_fraction_mean * step_time_ns) / sum(step_time_ns) bubble,
      sum(data_stall_fraction_mean * step_time_ns) / sum(step_time_ns) data_stall,
      sum(mfu * step_time_ns) filter (where coalesce(mfu_unknown, '') = '') / sum(step_time_ns) filter (where coalesce(mfu_unknown, '') = '') mfu
    from ${C} where step >= 2 and ranks_missing = 0`),
  straggler: await one(`with m as (select rank, median(duration_ns - exposed_comm_ns - pp_wait_ns - ckpt_ns) c
      from ${R} where step >= 2 group by rank)
    select rank, (select min(c) from m) / c score from m order by score, rank limit 1`),
};
console.log(JSON.stringify(out));
