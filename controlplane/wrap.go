package controlplane

import "strings"

// prefix starts every error of this package.
const prefix = "controlplane: "

// wrapError is an error with context that names the package once; see
// wrap.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

// wrap returns err with context: "controlplane: <context>: <err>", err's
// own leading "controlplane: " dropped so that the message names the
// package once (ErrStoreUnavailable and most of this package's errors
// carry it). errors.Is and errors.As see err.
func wrap(context string, err error) error {
	return &wrapError{msg: prefix + context + ": " + strings.TrimPrefix(err.Error(), prefix), err: err}
}
