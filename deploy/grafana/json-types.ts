// What a Grafana type looks like when it is written as JSON, so that a dashboard JSON file
// can be checked against @grafana/schema's own types.
//
// Grafana's types use string enums (ThresholdsMode, FieldColorModeId, MappingType, ...)
// and string literal unions (VariableType, ...). A JSON value can never have an enum type,
// so both helpers turn enums into the strings they stand for; everything else (numbers,
// booleans, arrays, nested objects, required fields) is checked as Grafana types it.

// A resolveJsonModule import: TypeScript widens every string in a .json file to `string`
// (there are no const JSON imports), so strings are checked as `string`.
export type Json<T> = T extends string
  ? string
  : T extends number
    ? number
    : T extends boolean | null | undefined
      ? T
      : T extends ReadonlyArray<infer U>
        ? Array<Json<U>>
        : T extends object
          ? { [K in keyof T]: Json<T[K]> }
          : T;

// An object literal (the dashboard pasted into a .ts file): literal types are kept, so an
// enum or union string must be one of its values ("absolute", "query", ...), and unknown
// properties are errors.
export type Literal<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends ReadonlyArray<infer U>
      ? Array<Literal<U>>
      : T extends object
        ? { [K in keyof T]: Literal<T[K]> }
        : T;
