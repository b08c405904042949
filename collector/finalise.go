package collector

import "time"

// finalising is when a job's parts are finalised: when an attempt ends,
// when the job goes quiet, and while its steps are held for its metadata.
// Its job's lock guards it; it does no I/O (the loop finalises).
type finalising struct {
	lastActive   time.Time // the last step record
	firstRecord  time.Time // the first one: steps are held for metadata until metaWait after it
	heldFull     bool      // a full step is held open for the metadata
	unfinalised  bool      // rows written since the parts were last finalised
	attemptEnded bool      // an attempt_end event since then
	ended        bool      // the last attempt ended (attempt_end or job_end) and no record came since
}
