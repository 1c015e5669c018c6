package controlplane_test

import (
	"testing"

	"github.com/limitplane/limitplane/controlplane"
)

// TestAdminEndpoints: the admin API takes an API's endpoints, gives them
// back as written, refuses bad ones with their field paths (nothing
// changed), and refuses to delete a policy an endpoint names.
func TestAdminEndpoints(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	expect(t, call(t, "PUT", base+"/api/policies/post-orders", `{"rate":{"requests":2,"per":"1m"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "PUT", base+"/api/policies/get-orders", `{"rate":{"requests":10,"per":"1m"}}`), 200, `{"revision":2}`)
	const shop = `{"id":"shop","listen_path":"/shop/","target":"builtin:echo","endpoints":[` +
		`{"method":"POST","path":"/orders","policies":["post-orders"]},` +
		`{"method":"GET","path":"/orders","policies":["get-orders"],"cost":1},` +
		`{"path":"/reports/{year}","cost":5}]}`
	expect(t, call(t, "PUT", base+"/api/apis/shop", shop), 200, `{"revision":3}`)
	expect(t, call(t, "GET", base+"/api/apis/shop", ""), 200, shop)

	expect(t, call(t, "PUT", base+"/api/apis/shop", `{"listen_path":"/shop/","target":"builtin:echo","endpoints":[`+
		`{"method":"FETCH","path":"/orders","policies":["post-orders"]},`+
		`{"method":"GET","path":"/orders/{id","policies":["get-orders"]},`+
		`{"method":"get","path":"/orders/","policies":["nope"]},`+
		`{"method":"GET","path":"/orders","policies":["get-orders"]}]}`), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[`+
			`{"path":"apis[\"shop\"].endpoints[0].method","problem":"unknown method \"FETCH\" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, or any)"},`+
			`{"path":"apis[\"shop\"].endpoints[1].path","problem":"\"/orders/{id\": a {param} must be a whole segment, like /orders/{id}"},`+
			`{"path":"apis[\"shop\"].endpoints[2].policies[0]","problem":"unknown policy \"nope\""},`+
			`{"path":"apis[\"shop\"].endpoints[3].path","problem":"duplicate endpoint GET /orders (first at apis[\"shop\"].endpoints[2].path)"}]}`)
	expect(t, call(t, "DELETE", base+"/api/policies/post-orders", ""), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[{"path":"apis[\"shop\"].endpoints[0].policies[0]","problem":"unknown policy \"post-orders\""}]}`)
	expect(t, call(t, "GET", base+"/api/apis/shop", ""), 200, shop)
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":3}`)
}
