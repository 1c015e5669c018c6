package core

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrMalformedCost is wrapped by the errors of CostHeader.Cost: a request
// asked for a cost its header cannot give (see CostHeader). The adapters
// and the gateway answer it 400 (gRPC InvalidArgument) before anything is
// counted.
var ErrMalformedCost = errors.New("malformed cost")

// CostHeader names a request header (a gRPC metadata key) whose value is
// the request's cost, as an operator configures it for an API
// (spec.API.CostHeader): LLM tokens, bytes, a GraphQL query's cost.
//
// A request without the header costs what it would without a CostHeader
// (the adapter's Cost option, else 1). An endpoint with a fixed cost
// (Endpoint.Cost) charges that cost whatever the header asks: the
// operator priced it, and a client does not lower the price; the header
// is still checked there, so a malformed one is refused everywhere.
type CostHeader struct {
	// Name is the header's name ("X-Cost"); "" means no cost header.
	// HTTP matches it without regard to case, gRPC metadata lower-cased.
	Name string
	// Max is the largest cost the header may ask, 1 to MaxCost; ≤ 0
	// means MaxCost. A larger value is malformed (not capped): a client
	// that asks for more than it may is told so.
	Max int64
}

// CostHeaderSource is implemented by deciders that know the cost header
// of the APIs they decide, so that a middleware need not be told it: a
// data-plane member's Limiter(api) answers from the API definition
// running when the request arrives (live.Config), so a control plane's
// change of cost_header applies at the next request.
type CostHeaderSource interface {
	// CostHeader returns api's cost header; a zero CostHeader when api
	// has none or is not known.
	CostHeader(api string) CostHeader
}

// MalformedCostError is the error of a cost header that gives no valid
// cost. It wraps ErrMalformedCost; its message names the header and the
// bound, not the value (which the client sent and may be long).
type MalformedCostError struct {
	// Header is the header's name as configured.
	Header string
	// Reason says what is wrong, e.g. "not a whole number".
	Reason string
}

func (e *MalformedCostError) Error() string {
	return fmt.Sprintf("malformed %s header: %s", e.Header, e.Reason)
}

// Unwrap returns ErrMalformedCost.
func (e *MalformedCostError) Unwrap() error { return ErrMalformedCost }

// Cost returns the cost the header's values ask (values as the request
// gives them: every field of that name, in order), or 0 and nil when
// there are none (the header is absent, or h has no Name). A value is a
// decimal whole number from 1 to h's bound, with no sign, spaces or
// leading zeros beyond "0" itself; anything else, or the header given
// more than once (two fields, or one with a comma-separated list), is a
// *MalformedCostError wrapping ErrMalformedCost. Zero is malformed too: a
// request of cost 0 would only peek at the counters.
func (h CostHeader) Cost(values []string) (int64, error) {
	if h.Name == "" || len(values) == 0 {
		return 0, nil
	}
	max := h.Max
	if max <= 0 || max > MaxCost {
		max = MaxCost
	}
	if len(values) > 1 {
		return 0, &MalformedCostError{Header: h.Name, Reason: "given more than once"}
	}
	// A field value's surrounding spaces and tabs are no part of it (RFC
	// 9110 section 5.5): net/http trims them, fasthttp leaves tabs.
	v := strings.Trim(values[0], " \t")
	if v == "" || len(v) > 16 {
		return 0, h.malformed(max)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			if v[i] == ',' {
				return 0, &MalformedCostError{Header: h.Name, Reason: "given more than once"}
			}
			return 0, h.malformed(max)
		}
	}
	if v[0] == '0' {
		return 0, h.malformed(max)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > max {
		return 0, h.malformed(max)
	}
	return n, nil
}

func (h CostHeader) malformed(max int64) error {
	return &MalformedCostError{Header: h.Name, Reason: "want a whole number from 1 to " + strconv.FormatInt(max, 10)}
}
