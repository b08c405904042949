// Reads a job's traces with DuckDB (a reader that is not ours) and prints
// what the Go test compares with its own figures.
import { DuckDBInstance } from '@duckdb/node-api';
const dir = process.argv[2];
const con = await (await DuckDBInstance.create(':memory:')).connect();
const one = async (q) => (await con.runAndReadAll(q)).getRowObjectsJson()[0];
const out = {
  cluster: await one(`select count(*)::bigint n, sum(tokens)::bigint tokens, sum(ranks_reported)::bigint ranks_reported from '${dir}/cluster_steps/*.parquet'`),
  ranks: await one(`select count(*)::bigint n, count(distinct rank)::bigint ranks, sum(case when dp_rank is null then 1 else 0 end)::bigint null_dp from '${dir}/rank_steps/*.parquet'`),
  // tokens recomputed from rank_steps, once per (step, dp_rank)
  tokens_from_ranks: await one(`select sum(t)::bigint tokens from (select distinct step, dp_rank, tokens t from '${dir}/rank_steps/*.parquet')`),
  events: await one(`select count(*)::bigint n from '${dir}/events/*.parquet'`),
  meta: await one(`select value::varchar v from parquet_kv_metadata('${dir}/cluster_steps/*.parquet') where key::varchar = 'tpsprof.schema_version' limit 1`),
};
console.log(JSON.stringify(out));
