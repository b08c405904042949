// Runs the first SQL block of docs/nodes.md (the fleet's hosts by
// GPU-hours lost) in DuckDB over an output folder's nodes/ table, OUT
// replaced by the folder, and prints its rows as JSON.
import { readFileSync } from 'node:fs';
import { DuckDBInstance } from '@duckdb/node-api';
const [doc, out] = process.argv.slice(2);
const sql = readFileSync(doc, 'utf8').split('```sql\n')[1].split('```')[0].replaceAll('OUT/', out + '/');
const con = await (await DuckDBInstance.create(':memory:')).connect();
console.log(JSON.stringify((await con.runAndReadAll(sql)).getRowObjectsJson()));
