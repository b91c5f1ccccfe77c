// Type-checks the Grafana dashboard against Grafana's own schema types (@grafana/schema):
//   .tools/node_modules/.bin/tsc --noEmit -p deploy/grafana
// (`make tools` installs @grafana/schema and typescript into .tools/node_modules.)
// tests/deploy/test_dashboard.py runs this, the same check with the dashboard pasted in as
// an object literal (string values against Grafana's enums, unknown properties), and
// copies with wrong-typed fields, which must fail.
import type { Dashboard } from "@grafana/schema";

import type { Json } from "./json-types";
import dashboard from "../../helm/kvcap-exporter/files/kvcap-dashboard.json";

export const kvcapDashboard: Json<Dashboard> = dashboard;
