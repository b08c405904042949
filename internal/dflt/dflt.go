// Package dflt fills in configuration defaults. It owns no state and
// does no I/O.
package dflt

// Number is what a default can be given to.
type Number interface {
	~int | ~int32 | ~int64 | ~float64 // time.Duration is an ~int64
}

// Positive sets *v to def when it is not above zero.
func Positive[T Number](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Zero sets *v to def when it is zero (a negative value keeps its own
// meaning, such as off).
func Zero[T Number](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}
