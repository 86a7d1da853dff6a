#!/usr/bin/env python3
"""Small WMT14-shaped archives for SMOKE=1 and the tests, generated: no download, no terms.

    python3 recipes/wmt14_smoke_data.py --pair en-de --dest DIR [--pairs 3000]

writes into DIR the archives the recipe fetches (europarl-v7.tgz, commoncrawl.tgz,
nc-v9.tgz, dev.tgz; for en-fr also un.tgz and giga-fren.tar), with the member paths of
the real ones (`training/europarl-v7.de-en.de`, `dev/newstest2014-deen-ref.de.sgm`, ...),
and `corpora.tsv`, a manifest of their sizes and sha256 in data/corpora.tsv's format.
The recipe then runs its ordinary fetch (`--local DIR --manifest DIR/corpora.tsv`),
checksum, extraction and SGM path on them.

The text is a word-for-word "translation" over a small lexicon, with the target
language's typographic quotes, dashes and (French) non-breaking spaces, so that the
evaluation text has what Moses normalization would destroy. Same arguments, same bytes.
Standard library only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import random
import sys
import tarfile
from pathlib import Path

# English, German, French.
LEXICON = [
    ("the", "die", "la"), ("house", "Haus", "maison"), ("city", "Stadt", "ville"), ("council", "Rat", "conseil"),
    ("government", "Regierung", "gouvernement"), ("people", "Menschen", "gens"), ("year", "Jahr", "année"),
    ("new", "neue", "nouvelle"), ("old", "alte", "vieille"), ("large", "große", "grande"),
    ("small", "kleine", "petite"), ("school", "Schule", "école"), ("street", "Straße", "rue"),
    ("police", "Polizei", "police"), ("minister", "Minister", "ministre"), ("says", "sagt", "dit"),
    ("wants", "will", "veut"), ("builds", "baut", "construit"), ("sees", "sieht", "voit"),
    ("today", "heute", "aujourd'hui"), ("yesterday", "gestern", "hier"), ("tomorrow", "morgen", "demain"),
    ("and", "und", "et"), ("or", "oder", "ou"), ("but", "aber", "mais"), ("not", "nicht", "pas"),
    ("very", "sehr", "très"), ("good", "gut", "bien"), ("water", "Wasser", "eau"), ("price", "Preis", "prix"),
    ("market", "Markt", "marché"), ("bank", "Bank", "banque"), ("company", "Firma", "société"),
    ("worker", "Arbeiter", "ouvrier"), ("children", "Kinder", "enfants"), ("parents", "Eltern", "parents"),
    ("doctor", "Arzt", "médecin"), ("hospital", "Krankenhaus", "hôpital"), ("train", "Zug", "train"),
    ("station", "Bahnhof", "gare"), ("bridge", "Brücke", "pont"), ("river", "Fluss", "fleuve"),
    ("election", "Wahl", "élection"), ("party", "Partei", "parti"), ("vote", "Stimme", "voix"),
    ("law", "Gesetz", "loi"), ("court", "Gericht", "tribunal"), ("judge", "Richter", "juge"),
    ("money", "Geld", "argent"), ("tax", "Steuer", "impôt"), ("budget", "Haushalt", "budget"),
    ("energy", "Energie", "énergie"), ("power", "Strom", "courant"), ("climate", "Klima", "climat"),
    ("weather", "Wetter", "météo"), ("summer", "Sommer", "été"), ("winter", "Winter", "hiver"),
    ("football", "Fußball", "football"), ("team", "Mannschaft", "équipe"), ("game", "Spiel", "match"),
    ("music", "Musik", "musique"), ("book", "Buch", "livre"), ("film", "Film", "film"),
    ("night", "Nacht", "nuit"), ("morning", "Morgen", "matin"), ("week", "Woche", "semaine"),
    ("country", "Land", "pays"), ("village", "Dorf", "village"), ("mayor", "Bürgermeister", "maire"),
    ("report", "Bericht", "rapport"), ("question", "Frage", "question"), ("answer", "Antwort", "réponse"),
    ("safety", "Sicherheit", "sécurité"), ("pedestrians", "Fußgänger", "piétons"), ("traffic", "Verkehr", "circulation"),
    ("million", "Millionen", "millions"), ("euros", "Euro", "euros"), ("percent", "Prozent", "pour cent"),
]
# Opening and closing quotes, and the target's dash, per language.
QUOTES = {"en": ("\u201c", "\u201d"), "de": ("\u201e", "\u201c"), "fr": ("\u00ab\u00a0", "\u00a0\u00bb")}
DASH = {"en": "\u2013", "de": "\u2013", "fr": "\u2013"}
COLUMN = {"en": 0, "de": 1, "fr": 2}


def sentence_pair(rng: random.Random, src: str, tgt: str) -> tuple[str, str]:
    words = [rng.choice(LEXICON) for _ in range(rng.randint(4, 14))]
    sides = []
    quoted = rng.random() < 0.3
    dashed = rng.random() < 0.2
    number = rng.randint(2, 999)
    for lang in (src, tgt):
        tokens = [w[COLUMN[lang]] for w in words]
        tokens[0] = tokens[0][:1].upper() + tokens[0][1:]
        if quoted:
            opening, closing = QUOTES[lang]
            tokens[1] = opening + tokens[1]
            tokens[-1] = tokens[-1] + closing
        if dashed:
            tokens.insert(len(tokens) // 2, DASH[lang])
        tokens.append(str(number))
        end = "\u00a0?" if lang == "fr" and number % 5 == 0 else ("?" if number % 5 == 0 else ".")
        sides.append(" ".join(tokens) + end)
    return sides[0], sides[1]


def corpus(seed: int, count: int, src: str, tgt: str) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    pairs = [sentence_pair(rng, src, tgt) for _ in range(count)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def sgm(lines: list[str], setid: str, lang: str, kind: str) -> str:
    """An SGM file as WMT writes them: one document, a `<seg id="N">` per line."""
    head = f'<{kind}set setid="{setid}" srclang="any" trglang="{lang}">\n<doc sysid="ref" docid="1" genre="news" origlang="en">\n'
    body = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, 1))
    return head + body + f"</doc>\n</{kind}set>\n"


def archive(members: dict[str, bytes], gzipped: bool) -> bytes:
    """A tar (gzipped or not) of `members`, byte-identical on every run."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    if not gzipped:
        return raw.getvalue()
    return gzip.compress(raw.getvalue(), mtime=0)


def text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")


def build(pair: str, pairs: int) -> dict[str, bytes]:
    """Manifest name -> archive bytes, as the recipe's `archives(pair)` lists them."""
    src, tgt = pair.split("-")
    corpus_pair = f"{tgt}-en"
    share = max(pairs // (5 if pair == "en-fr" else 3), 10)
    parts = {}
    for seed, name in enumerate(("europarl", "commoncrawl", "news-commentary", "un", "giga")):
        parts[name] = corpus(seed, share, src, tgt)
    valid = corpus(11, 200, src, tgt)
    test = corpus(12, 100, src, tgt)
    pair_id = f"{tgt}en"

    def sides(stem: str, name: str) -> dict[str, bytes]:
        return {f"{stem}.{src}": text(parts[name][0]), f"{stem}.{tgt}": text(parts[name][1])}

    out = {
        "wmt14/europarl-v7.tgz": archive(sides(f"training/europarl-v7.{corpus_pair}", "europarl"), True),
        "wmt14/commoncrawl.tgz": archive(sides(f"commoncrawl.{corpus_pair}", "commoncrawl"), True),
        "wmt14/nc-v9.tgz": archive(sides(f"training/news-commentary-v9.{corpus_pair}", "news-commentary"), True),
        "wmt/dev.tgz": archive({
            f"dev/newstest2013.{src}": text(valid[0]), f"dev/newstest2013.{tgt}": text(valid[1]),
            f"dev/newstest2014-{pair_id}-src.{src}.sgm": sgm(test[0], "newstest2014", src, "src").encode("utf-8"),
            f"dev/newstest2014-{pair_id}-ref.{tgt}.sgm": sgm(test[1], "newstest2014", tgt, "ref").encode("utf-8"),
        }, True),
    }
    if pair == "en-fr":
        out["wmt14/un.tgz"] = archive(sides("un/undoc.2000.fr-en", "un"), True)
        giga = {f"giga-fren.release2.fixed.{lang}.gz": gzip.compress(data, mtime=0)
                for lang, data in ((src, text(parts["giga"][0])), (tgt, text(parts["giga"][1])))}
        out["wmt14/giga-fren.tar"] = archive(giga, False)
    return out


def write(pair: str, dest: Path, pairs: int) -> Path:
    """Write the archives and their manifest into `dest`; returns the manifest's path."""
    dest.mkdir(parents=True, exist_ok=True)
    rows = ["name\turl\tsha256\tbytes\tunpack\tterms\tcitation"]
    for name, data in build(pair, pairs).items():
        filename = name.rsplit("/", 1)[-1]
        (dest / filename).write_bytes(data)
        rows.append(f"{name}\tfile:///{filename}\t{hashlib.sha256(data).hexdigest()}\t{len(data)}\tnone\t"
                    "generated by recipes/wmt14_smoke_data.py (no terms)\t-")
    manifest = dest / "corpora.tsv"
    manifest.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", required=True, choices=("en-de", "en-fr"))
    parser.add_argument("--dest", required=True, type=Path)
    parser.add_argument("--pairs", type=int, default=3000, help="training pairs, spread over the corpora")
    args = parser.parse_args(argv)
    write(args.pair, args.dest, args.pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
