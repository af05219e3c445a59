// The comparison flags of `tb-parity diff` that the routes take besides the tolerance fields:
// `--map`, `--allow-unmatched`, `--override`, `--equal-nan`, `--accept-fewer-steps` and
// `--accept-read-problems`, typed (or pasted from a note or the CLI) as the shell would split them,
// so the tab can show the verdict the CLI gave with them. An INCOMPLETE verdict names its accept
// flag ("Accept it with --accept-fewer-steps"): the field refused it, and the tab could not give
// the CLI's verdict with it.

import type { Params } from "./api";

/** Flags without a value, and the route parameter each sets. */
const SWITCHES: Record<string, "equal_nan" | "accept_fewer_steps" | "accept_read_problems"> = {
  "--equal-nan": "equal_nan",
  "--accept-fewer-steps": "accept_fewer_steps",
  "--accept-read-problems": "accept_read_problems",
};

const LISTS: Record<string, "mapping" | "allow_unmatched" | "override"> = {
  "--map": "mapping",
  "--allow-unmatched": "allow_unmatched",
  "--override": "override",
};

/** Split ``text`` into words as a POSIX shell does for plain words and '…' / "…" quotes. */
export function words(text: string): string[] {
  const out: string[] = [];
  let word: string | null = null;
  let quote: string | null = null;
  for (const ch of text) {
    if (quote) {
      if (ch === quote) quote = null;
      else word = (word ?? "") + ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      word = word ?? "";
    } else if (/\s/.test(ch)) {
      if (word !== null) out.push(word);
      word = null;
    } else {
      word = (word ?? "") + ch;
    }
  }
  if (quote) throw new Error(`unclosed ${quote} quote in the flags`);
  if (word !== null) out.push(word);
  return out;
}

/** ``value`` quoted for a POSIX shell (and for `words`): '…', a ' inside spelled '"'"'. */
export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'"'"'`)}'`;
}

/** ``text`` with ``flag value`` added at its end, or unchanged when ``text`` already has that pair
 * (a suggestion applied twice adds nothing); text that does not split is kept as it is, before it. */
export function withFlag(text: string, flag: string, value: string): string {
  try {
    const given = parseFlags(text);
    const key = LISTS[flag];
    if (key && (given[key] as string[] | undefined)?.includes(value)) return text;
  } catch {
    // an unreadable field keeps its error; the flag is still added after it
  }
  const added = `${flag} ${shellQuote(value)}`;
  return text.trim() ? `${text.trimEnd()} ${added}` : added;
}

/** The route parameters of ``text`` (flags as `tb-parity diff` takes them), or an error to show. */
export function parseFlags(text: string): Params {
  const lists: Record<"mapping" | "allow_unmatched" | "override", string[]> = { mapping: [], allow_unmatched: [], override: [] };
  const out: Params = {};
  const given = words(text);
  for (let i = 0; i < given.length; i++) {
    const word = given[i];
    const eq = word.indexOf("=");
    const flag = word.startsWith("--") && eq > 0 ? word.slice(0, eq) : word;
    if (word in SWITCHES) {
      out[SWITCHES[word]] = "1";
    } else if (flag in LISTS) {
      const value = eq > 0 && word.startsWith("--") ? word.slice(eq + 1) : given[++i];
      if (value === undefined) throw new Error(`${flag} needs a value`);
      lists[LISTS[flag]].push(value);
    } else {
      throw new Error(`unknown flag ${JSON.stringify(word)}: the tab takes --map, --allow-unmatched, --override, --equal-nan, --accept-fewer-steps and --accept-read-problems`);
    }
  }
  for (const [key, values] of Object.entries(lists)) if (values.length) out[key] = values;
  return out;
}
