package protocol

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxGatewayIDBytes is the longest gateway_id a Hello may carry, in bytes.
const MaxGatewayIDBytes = 256

// CheckGatewayID returns an error (starting "gateway_id ") unless id can
// name a gateway in a Hello: 1 to MaxGatewayIDBytes bytes of UTF-8 without
// control characters. A control plane keeps the id of every gateway that
// connects (for an hour after it leaves), lists it and logs it, so a
// gateway holding a valid token cannot make it keep a large one.
func CheckGatewayID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("gateway_id is empty")
	case len(id) > MaxGatewayIDBytes:
		return fmt.Errorf("gateway_id is %d bytes long, more than %d", len(id), MaxGatewayIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("gateway_id %q is not UTF-8", id)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("gateway_id %q has a control character", id)
		}
	}
	return nil
}
