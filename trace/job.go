package trace

import (
	"fmt"
	"os"
	"path/filepath"
)

// A Job is a job folder (OUT/<job>) opened for reading once: its tables'
// folders, the parts its reads open kept with their footers read once
// (Footers), and the bytes they read (Meter). Every read through Read()
// shares them. Close closes the parts kept open.
type Job struct {
	dir     string
	meter   Meter
	footers Footers
	read    ReadOption
}

// OpenJob opens the job folder dir; an error when it is not a folder.
func OpenJob(dir string) (*Job, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a job folder of Parquet traces", dir)
	}
	j := &Job{dir: dir}
	j.read = All(Metered(&j.meter), Reuse(&j.footers))
	return j, nil
}

// Dir is the job folder.
func (j *Job) Dir() string { return j.dir }

// Table is the folder of table name (ClusterSteps, RankSteps, …).
func (j *Job) Table(name string) string { return filepath.Join(j.dir, name) }

// Read is the read option every read of the job takes.
func (j *Job) Read() ReadOption { return j.read }

// BytesRead is what the job's reads have read so far, footers included.
func (j *Job) BytesRead() int64 { return j.meter.Bytes() }

// Close closes the parts kept open.
func (j *Job) Close() error { return j.footers.Close() }
