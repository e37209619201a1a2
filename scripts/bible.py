#!/usr/bin/env python3
"""Builds the Spanish-English Bible corpus from two SWORD modules exported
with mod2imp (called by scripts/data.sh bible; docs/TRANSLATION.md).

  scripts/bible.py SRC.imp TGT.imp OUTDIR [--versions TEXT]

SRC.imp / TGT.imp: `mod2imp MODULE` output (raw OSIS, one "$$$Book C:V" key
line followed by the verse text). Each verse is cleaned (below), the two
texts are aligned by reference, a pair with either side empty is dropped, and
the pairs are split by whole books into OUTDIR/{train,valid,test}.{es,en,ref}
(line-aligned UTF-8, "\\n" line ends, one verse a line; .ref is the reference
"Book C:V"), plus OUTDIR/MANIFEST (counts, split, sources). Every file is
written to a temporary name and renamed. The output is a pure function of the
two inputs (and Python's Unicode tables for NFC): no clocks, no randomness.

Cleaning (raw OSIS -> plain text):
  - dropped with their content: <note> (footnotes, cross references) and
    <title> that is not canonical="true" (section headings); a canonical
    title (a psalm's superscription, which the Spanish text has inside verse
    1) keeps its text;
  - every other tag is removed and its text kept (<w> with Strong's numbers,
    <transChange>, <divineName>, <q>, ...); block tags (<l>, <lg>, <p>,
    <div>, <chapter>, <title>) and <milestone>/<lb> become a space;
  - a removed note between two words leaves one space ("God<note/>created"
    -> "God created"), before punctuation nothing;
  - XML character references and the five XML entities are decoded;
  - Unicode NFC; every run of whitespace (Unicode, including U+00A0 and
    zero-width spaces U+200B) becomes one space; leading and trailing
    space is removed; control and format characters (Unicode Cc, Cf) are
    removed; a space before . , ; : ! ? is removed (markup between a word
    and its punctuation);
  - what follows the end of the last book (the WEB's glossary) is dropped.
Verses 0 (book and chapter introductions) and the module headings are not
verses and are skipped.
"""
import os
import re
import sys
import unicodedata

# Whole books held out (deterministic, documented in docs/TRANSLATION.md).
# Test: Old Testament narrative, poetry and a gospel without synoptic
# parallels; valid: narrative and an epistle. Everything else is train.
TEST_BOOKS = ("Joshua", "Lamentations", "John")
VALID_BOOKS = ("Judges", "Hebrews")
SPLITS = ("train", "valid", "test")

KEY = re.compile(r"^\$\$\$(.+) (\d+):(\d+)$")
TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9_:.-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*?)(/?)>")
ATTR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:.-]*)\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")
ENTITY = re.compile(r"&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9A-Fa-f]+);")
BLOCK = {"l", "lg", "p", "div", "chapter", "title", "milestone", "lb", "list", "item", "head", "table", "row",
         "cell", "br"}
NOTE_GAP = "\x00"


def entity(m):
    e = m.group(1)
    named = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
    if e in named:
        return named[e]
    cp = int(e[2:], 16) if e[1] in "xX" else int(e[1:])
    return chr(cp) if 0 < cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF else ""


def attrs(s):
    return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in ATTR.finditer(s)}


def clean(osis):
    """One verse's raw OSIS -> plain NFC text with single spaces."""
    out = []
    hide = []  # open elements whose content is dropped: (name, milestone id or None)
    pos = 0
    for m in TAG.finditer(osis):
        if not hide:
            out.append(osis[pos:m.start()])
        pos = m.end()
        closing, name, rest, selfclose = m.group(1) == "/", m.group(2), m.group(3), m.group(4) == "/"
        a = attrs(rest)
        dropped = name == "note" or (name == "title" and a.get("canonical") != "true")
        if name == "div" and "eID" in a and a.get("type") == "book":
            pos = len(osis)  # the end of a book: what follows is back matter (a glossary)
            break
        if selfclose:
            # milestoned containers: <note sID=.../> ... <note eID=.../>
            if dropped and "sID" in a:
                hide.append((name, a["sID"]))
            elif hide and "eID" in a and hide[-1] == (name, a["eID"]):
                hide.pop()
                if name == "note" and not hide:
                    out.append(NOTE_GAP)
            elif not hide and name in BLOCK:
                out.append(" ")
            continue
        if not closing:
            if hide or dropped:
                hide.append((name, None))
            elif name in BLOCK:
                out.append(" ")
            continue
        if hide:
            if hide[-1] == (name, None):
                hide.pop()
                if not hide and name == "note":
                    out.append(NOTE_GAP)
            continue
        if name in BLOCK:
            out.append(" ")
    if not hide:
        out.append(osis[pos:])
    text = ENTITY.sub(entity, "".join(out))
    text = unicodedata.normalize("NFC", text)
    text = "".join(" " if c.isspace() or c in "\u200b\ufeff" else c for c in text)
    text = "".join(c for c in text if c == NOTE_GAP or unicodedata.category(c) not in ("Cc", "Cf"))
    # a removed note leaves a space only between a word and what follows it
    # as a new word; before punctuation or space it leaves nothing
    chars = []
    for i, c in enumerate(text):
        if c != NOTE_GAP:
            chars.append(c)
            continue
        nxt = next((d for d in text[i + 1:] if d != NOTE_GAP), "")
        prev = chars[-1] if chars else ""
        if prev and nxt and not prev.isspace() and not nxt.isspace() and (nxt.isalnum() or nxt in "“‘(¿¡\"'"):
            chars.append(" ")
    # markup between a word and its punctuation can leave a space before it
    # (neither text ever spaces . , ; : ! ? off the word before)
    return re.sub(" ([.,;:!?])", r"\1", re.sub(" +", " ", "".join(chars))).strip()


def read_imp(path):
    """mod2imp output -> {(book, chapter, verse): text}, and the books in order."""
    verses, books, key, lines = {}, [], None, []

    def flush():
        if key is not None and key[1] > 0 and key[2] > 0:
            if key in verses:
                sys.exit(f"bible: {path}: {key[0]} {key[1]}:{key[2]} appears twice")
            verses[key] = clean("\n".join(lines))
            if key[0] not in books:
                books.append(key[0])

    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("$$$"):
                flush()
                m = KEY.match(line)
                key = (m.group(1), int(m.group(2)), int(m.group(3))) if m else None
                lines = []
            else:
                lines.append(line)
    flush()
    return verses, books


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main():
    args = sys.argv[1:]
    versions = ""
    if "--versions" in args:
        i = args.index("--versions")
        versions = args[i + 1]
        del args[i:i + 2]
    if len(args) != 3:
        sys.exit("usage: scripts/bible.py SRC.imp TGT.imp OUTDIR [--versions TEXT]")
    src, books_src = read_imp(args[0])
    tgt, _ = read_imp(args[1])
    out = args[2]
    for b in TEST_BOOKS + VALID_BOOKS:
        if b not in books_src:
            sys.exit(f"bible: held-out book {b} is not in {args[0]}")
    order = {b: i for i, b in enumerate(books_src)}
    # A chapter in which one text has a verse the other lacks may be numbered
    # differently in the two (the Spanish module follows the Hebrew numbering
    # in a few chapters, leaving an empty verse where its text moved): it is
    # dropped whole, and when the lone verse is the chapter's last, the next
    # chapter too (the text moved across the chapter boundary).
    last = {}
    for k in src:
        last[k[:2]] = max(last.get(k[:2], 0), k[2])
    shifted = set()
    for k in src:
        if k in tgt and bool(src[k]) != bool(tgt[k]):
            shifted.add(k[:2])
            if k[2] == last[k[:2]] and (k[0], k[1] + 1) in last:
                shifted.add((k[0], k[1] + 1))
    rows = {s: [] for s in SPLITS}
    dropped = {"empty_es": 0, "empty_en": 0, "only_es": 0, "shifted": 0}
    for key in sorted(src, key=lambda k: (order[k[0]], k[1], k[2])):
        es, en = src[key], tgt.get(key)
        if en is None:
            dropped["only_es"] += 1
            continue
        if not es or not en:
            dropped["empty_es" if not es else "empty_en"] += 1
            continue
        if key[:2] in shifted:
            dropped["shifted"] += 1
            continue
        split = "test" if key[0] in TEST_BOOKS else "valid" if key[0] in VALID_BOOKS else "train"
        rows[split].append((f"{key[0]} {key[1]}:{key[2]}", es, en))
    only_en = sum(1 for k in tgt if k not in src)
    os.makedirs(out, exist_ok=True)
    total = sum(len(r) for r in rows.values())
    man = ["# birkhoff Bible corpus, Spanish (Reina-Valera 1909) -> English (World English Bible)",
           "# built by scripts/data.sh bible (scripts/bible.py); docs/TRANSLATION.md",
           "# files: {train,valid,test}.{es,en,ref}: line-aligned UTF-8 (NFC), one verse a line",
           f"sources {versions}".rstrip(),
           f"split test = {', '.join(TEST_BOOKS)}",
           f"split valid = {', '.join(VALID_BOOKS)}",
           "split train = every other book present in both texts",
           f"dropped empty_es={dropped['empty_es']} empty_en={dropped['empty_en']} "
           f"only_es={dropped['only_es']} only_en={only_en} shifted={dropped['shifted']}",
           "dropped chapters " + ", ".join(f"{b} {c}" for b, c in sorted(shifted, key=lambda x: (order[x[0]], x[1])))]
    for s in SPLITS:
        r = rows[s]
        for ext, col in (("ref", 0), ("es", 1), ("en", 2)):
            write_atomic(os.path.join(out, f"{s}.{ext}"), "".join(x[col] + "\n" for x in r).encode("utf-8"))
        books = len({x[0].rsplit(" ", 1)[0] for x in r})
        chars_es = sum(len(x[1]) for x in r)
        chars_en = sum(len(x[2]) for x in r)
        man.append(f"count {s} pairs={len(r)} books={books} pct={100.0 * len(r) / total:.2f} "
                   f"chars_es={chars_es} chars_en={chars_en}")
    man.append(f"count all pairs={total}")
    write_atomic(os.path.join(out, "MANIFEST"), ("\n".join(man) + "\n").encode("utf-8"))
    print("\n".join(m for m in man if m.startswith(("count", "dropped"))))


if __name__ == "__main__":
    main()
