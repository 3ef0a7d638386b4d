"""Title nouns for WebShop's type reward: spaCy's tagger when installed, else a model-free fallback.

WebShop's ``get_type_reward`` runs spaCy's ``en_core_web_sm`` over the goal's and the purchased
product's titles and keeps the lower-cased text of every token tagged ``NOUN`` or ``PROPN`` (its
list also names ``PNOUN``, which is not a spaCy tag and never matches). The result is a *list*:
repeated nouns count again in the title score's denominator. A :class:`NounExtractor` returns the
same thing as a tuple, in title order, repeats kept.

- :class:`SpacyNouns` is that extractor, exactly: ``SpacyNouns()`` loads ``en_core_web_sm`` by
  name (install it with ``python -m spacy download en_core_web_sm``), ``SpacyNouns(PATH)`` loads a
  model folder. Only the tagger path runs (tok2vec, tagger, attribute_ruler): the parser,
  lemmatizer and NER do not change ``pos_`` and cost two thirds of the time.
- :class:`FallbackNouns` needs no model: a tokenizer following spaCy's English punctuation rules
  and a small hand-written lexicon of English function words, number words and common product-title
  adjectives/verbs, with suffix rules for the rest. On WebShop's 1000-product catalogue (1000 goals,
  each scored for its own product, 3 of the same category and 3 random ones) it changes 1.0% of
  purchase rewards relative to ``en_core_web_sm`` 3.8; an extractor keeping every word changes
  13%. See ``tests/envs/test_webshop_reward.py``.

:func:`default_noun_extractor` picks one per process: the model named by ``$WEBSHOP_SPACY_MODEL``
(a name or a folder), else ``en_core_web_sm`` if it loads, else the fallback; it says which on
stderr once. Both extractors memoise titles, which repeat across steps and episodes, and take
``prefetch(titles)`` to fill that memo at load time (batched through spaCy's ``nlp.pipe``).

A catalogue's titles are tagged once, when an env loads it (:func:`prepare_title_nouns`), so no
step runs the tagger: the nouns of every product and goal title are computed in batches and
pinned in the extractor (never evicted), and kept on disk under
``$AGENTGYM_CACHE/webshop/nouns-<extractor tag>-<titles digest>.json``. The file is named by the
extractor's :attr:`~SpacyNouns.cache_tag` (model name and version, spaCy's version) and a digest of
the titles themselves, so another model or another catalogue never reads a stale table. It is
written atomically (temporary file + rename); when the cache folder is not writable the table
lives in memory only. Tagging WebShop's 1.18M-product catalogue takes a while once; every later
process loads the table.

Note that the tagger's version matters as much as the tagger: WebShop pinned spaCy 3.3, whose
``en_core_web_sm`` tags a few title words differently from 3.8's (WebShop's own test titles score
0.333 / 0.3 / 0.15 with 3.3 and 0.4 / 0.3125 / 0.167 with 3.8, in the same r_type buckets).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from agentgym.io import atomic_write_text

__all__ = [
    "NOUN_POS",
    "FallbackNouns",
    "NounExtractor",
    "SpacyNouns",
    "default_noun_extractor",
    "prepare_title_nouns",
    "reset_default_noun_extractor",
    "titles_digest",
]

#: The part-of-speech tags WebShop keeps ("PNOUN" is in its list but is no spaCy tag).
NOUN_POS: frozenset[str] = frozenset({"PNOUN", "NOUN", "PROPN"})

#: Environment variable naming the spaCy model (a package name or a model folder).
MODEL_ENV_VAR = "WEBSHOP_SPACY_MODEL"

_DEFAULT_MODEL = "en_core_web_sm"
_MEMO_LIMIT = 1 << 17  # distinct titles memoised per extractor (WebShop's full catalogue: ~1.2M)


@runtime_checkable
class NounExtractor(Protocol):
    """Maps a title to its lower-cased noun tokens, in order, repeats kept."""

    def __call__(self, text: str) -> tuple[str, ...]: ...


class _Memo:
    """A str -> tuple memo: a pinned table (a catalogue's titles, never evicted) in front of a
    bounded memo for other titles, cleared wholesale when full (titles repeat in bursts)."""

    def __init__(self, compute: Callable[[str], tuple[str, ...]]) -> None:
        self._compute = compute
        self._pinned: dict[str, tuple[str, ...]] = {}
        self._memo: dict[str, tuple[str, ...]] = {}

    def __call__(self, text: str) -> tuple[str, ...]:
        nouns = self._pinned.get(text)
        if nouns is None:
            nouns = self._memo.get(text)
            if nouns is None:
                nouns = self._compute(text)
                self.put(text, nouns)
        return nouns

    def __contains__(self, text: str) -> bool:
        return text in self._pinned or text in self._memo

    def pin(self, texts: Sequence[str], nouns: Sequence[tuple[str, ...]]) -> None:
        self._pinned.update(zip(texts, nouns, strict=True))

    def put(self, text: str, nouns: tuple[str, ...]) -> None:
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[text] = nouns


class SpacyNouns:
    """WebShop's title nouns from a spaCy pipeline: ``[t.text.lower() for t in nlp(text) if t.pos_ in
    ("PNOUN", "NOUN", "PROPN")]``, as a tuple.

    Args:
        model: a spaCy package name (default ``en_core_web_sm``, WebShop's model) or a path to an
            unpacked model folder.

    Raises:
        OSError: the model is not installed; the message says how to install it.
        ImportError: spaCy itself is missing (``pip install -e ".[spacy]"`` in a clone).
    """

    def __init__(self, model: str | os.PathLike[str] = _DEFAULT_MODEL) -> None:
        import spacy

        self.model = str(model)
        try:
            # pos_ comes from tagger + attribute_ruler; the rest of the pipeline never touches it
            self._nlp = spacy.load(self.model, exclude=["parser", "ner", "lemmatizer", "senter"])
        except OSError as exc:
            raise OSError(
                f"spaCy model {self.model!r} not found: install WebShop's model with "
                f"`python -m spacy download {_DEFAULT_MODEL}`, point ${MODEL_ENV_VAR} at an "
                "unpacked model folder, or use FallbackNouns()"
            ) from exc
        self._memo = _Memo(self._extract)
        self._prepared: set[str] = set()
        meta = self._nlp.meta
        #: names the on-disk noun tables: another model, version or spaCy release tags anew
        self.cache_tag: str = (
            f"spacy{spacy.__version__}-{meta.get('lang', 'xx')}_{meta.get('name', 'model')}"
            f"-{meta.get('version', '0')}"
        )

    def _extract(self, text: str) -> tuple[str, ...]:
        return tuple(t.text.lower() for t in self._nlp(text) if t.pos_ in NOUN_POS)

    def __call__(self, text: str) -> tuple[str, ...]:
        return self._memo(text)

    def extract_many(self, texts: Sequence[str], batch_size: int = 256) -> list[tuple[str, ...]]:
        """Nouns of each of ``texts``, tagged in batches (``nlp.pipe``: about twice as fast as one
        by one); noun strings are interned, as a catalogue's titles share most of their nouns."""
        intern = sys.intern
        return [
            tuple(intern(t.text.lower()) for t in doc if t.pos_ in NOUN_POS)
            for doc in self._nlp.pipe(texts, batch_size=batch_size)
        ]

    def prefetch(self, texts: Iterable[str], batch_size: int = 256) -> None:
        """Tag ``texts`` now, in batches (about twice as fast as one by one), into the memo."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._memo))
        for text, nouns in zip(todo, self.extract_many(todo, batch_size), strict=True):
            self._memo.put(text, nouns)

    def prepare(
        self, titles: Sequence[str], digest: str, cache_dir: str | os.PathLike[str] | None = None
    ) -> int:
        """Pin the nouns of every one of ``titles`` (distinct), from the disk cache or tagged now.

        See :func:`prepare_title_nouns`. Returns how many titles were tagged (0 from the cache).
        """
        return _prepare(self, titles, digest, cache_dir)

    def __reduce__(self):
        # a pickled extractor reloads its model by name/path instead of shipping the pipeline
        return (type(self), (self.model,))

    def __repr__(self) -> str:
        return f"SpacyNouns({self.model!r})"


# ---------------------------------------------------------------------------------------------
# Fallback: spaCy-like tokenisation + a lexicon of words that are *not* nouns.
# ---------------------------------------------------------------------------------------------

# Tokenisation (spaCy's English rules, restricted to what product titles contain): split on
# whitespace; peel prefix punctuation (brackets, quotes, $, #, ...); peel suffix punctuation,
# "'s", units after digits ("5.5ft" -> "5.5", "ft") and a final period; split hyphens and slashes
# between letters ("Sofa-Tables", "DVD/VCR"), and a hyphen after a digit before a letter ("3-Piece").
_PREFIX = re.compile(r"""^(?:[\(\[\{<"'“‘«`´,:;!?&*#_§%=+$£€¥~]|—|–|\.\.+|…)""")
_SUFFIX = re.compile(
    r"""(?:[\)\]\}>"'”’»`´,:;!?&*#_~%]|—|–|\.\.+|…|'s|'S|’s|’S"""
    r"""|(?<=[0-9])(?:km|m|dm|cm|mm|ha|nm|yd|in|ft|kg|g|mg|t|lb|oz|mph|mb|MB|kb|KB|gb|GB|tb|TB"""
    r"""|T|G|M|K|\$|\+)"""
    r"""|(?<=[0-9a-z%"'”’)\]])\.|(?<=[A-Z][A-Z])\.)$"""
)
_INFIX = re.compile(
    r"(?<=[A-Za-z0-9])(?:-|–|—|~|/|:|<|>|=)(?=[A-Za-z])"
    r"|(?<=[A-Za-z]),(?=[A-Za-z])|(?<=[a-z])\.(?=[A-Z])"
    r"|(?<=[0-9])[+*^](?=[0-9-])|(?<=[0-9])-(?=[0-9-])"
)
_HAS_LETTER = re.compile(r"[^\W\d_]")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:[.,/:]\d+)*|\d*\.\d+)(?:st|nd|rd|th|s)?$", re.IGNORECASE)


def _tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens the way spaCy's English tokenizer does for ordinary titles."""
    tokens: list[str] = []
    for chunk in text.split():
        if chunk.isalpha():  # most title words: nothing to peel or split
            tokens.append(chunk)
            continue
        prefixes: list[str] = []
        suffixes: list[str] = []
        while chunk:
            m = _PREFIX.match(chunk)
            if m is None or m.end() == len(chunk):
                break
            prefixes.append(m.group())
            chunk = chunk[m.end() :]
        while chunk:
            m = _SUFFIX.search(chunk)
            if m is None or m.start() == 0:
                break
            suffixes.append(m.group())
            chunk = chunk[: m.start()]
        tokens.extend(prefixes)
        if chunk:
            start = 0
            for m in _INFIX.finditer(chunk):
                if m.start() > start:
                    tokens.append(chunk[start : m.start()])
                tokens.append(m.group())
                start = m.end()
            tokens.append(chunk[start:])
        tokens.extend(reversed(suffixes))
    return tokens


def _words(block: str) -> frozenset[str]:
    return frozenset(block.split())


# Closed-class words: never nouns, whatever their case ("For", "WITH", "and").
_FUNCTION_WORDS = _words("""
    a an the this that these those each every either neither some any no both another such
    what which whose whatever i me my mine you your yours he him his she her hers it its we us our
    ours they them their theirs myself yourself himself herself itself ourselves themselves who
    whom about above across after against along among amongst around as at before behind below
    beneath beside besides between beyond by despite down during except for from in inside into
    near of off on onto out outside over per since through throughout till to toward towards
    under underneath until unto up upon via with within without and or but nor yet if because
    while whether than though although unless whereas is are was were be been being am do does
    did doing have has had having can could will would shall should may might must 's n't not
    very too also just only even ever never always often here there now then again away
    together almost quite rather really so how when where why whenever
""")

# Number words and ordinals: NUM / ADJ.
_NUMBER_WORDS = _words("""
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred thousand million billion dozen first second third fourth fifth sixth seventh eighth
    ninth tenth
""")

# Words that a title uses as adjectives, verbs or adverbs when written in lower case. In title
# case spaCy tags most of them PROPN, so they only count as non-nouns in lower case.
_LOWER_NON_NOUNS = _words("""
    new old small large big little huge tiny tall short long high low wide narrow thin thick
    slim heavy light lightweight soft hard firm hot cold warm cool dry wet fresh clean pure free
    easy simple basic classic modern vintage retro rustic elegant luxury luxurious fancy cute
    pretty beautiful lovely sexy casual formal comfortable comfy cozy durable sturdy strong
    portable adjustable foldable washable reusable rechargeable waterproof breathable stretchy
    stretch natural organic vegan healthy nutritious delicious sweet sour spicy salty tasty
    gluten-free sugar-free non-gmo kosher premium professional original authentic genuine real
    perfect great good best better top ideal extra super ultra full empty whole complete
    multi multiple various different same other own certain special unique creative decorative
    digital electric electronic wireless smart automatic manual mini compact slim flat round
    square rectangular oval straight curly wavy smooth rough shiny matte glossy clear transparent
    black white red blue green yellow pink purple gray grey brown orange silver golden beige navy
    dark bright pale deep rich vibrant colorful multicolor assorted mixed solid printed floral
    striped plaid plain cotton leather wooden metal metallic plastic ceramic stainless steel
    glass silk wool woolen linen denim velvet suede faux synthetic
    men's women's mens womens unisex adult adults kid kids baby toddler youth boy's girl's
    indoor outdoor daily everyday anti non-slip nonslip slip-resistant resistant proof
    made used designed suitable compatible available included perfect fit fits fitting
    fitted stylish fashionable trendy fashion sleeveless short-sleeve long-sleeve loose tight
    plus petite tall regular oversized slim-fit skinny relaxed
    sensitive oily dry normal damaged frizzy fine thin thick coarse dull
    moisturizing hydrating nourishing soothing cleansing refreshing brightening whitening
    long-lasting lasting waterproof smudge-proof
    heavy-duty duty non-toxic eco-friendly friendly safe safety
    personal perfect essential single double triple half x
""")

# Adjectives and participles that stay non-nouns even capitalised in a title ("Full Size",
# "Made in USA", "Compatible with ...").
_CAPITALISED_NON_NOUNS = _words("""
    full large made all original based designed included includes fully
""")

# Symbols spaCy's tagger calls NOUN inside titles ("Shampoo | 8 oz", "100 %", "360 °").
_SYMBOL_NOUNS = frozenset({"|", "%", "°"})

# Lower-case word endings that mark adjectives, verbs and adverbs; exceptions are nouns.
_NON_NOUN_SUFFIXES = (
    "able", "ible", "ful", "less", "ous", "ive", "ish", "ly", "ed", "est", "ical",
)  # fmt: skip
_SUFFIX_NOUN_EXCEPTIONS = _words("""
    table cable stable vegetable turntable timetable bible fly butterfly supply family belly
    jelly lily bully assembly holly rally ally anomaly ply reply bed shed sled seed weed speed
    feed need reed steed breed bleed tweed deed creed pest nest chest vest test rest guest
    forest crest quest interest harvest contest protest drive olive archive five knife life wife
    wool bowl
""")


class FallbackNouns:
    """Title nouns without a model: spaCy-like tokens minus function words, numbers and adjectives.

    A token counts as a noun when it has a letter, is not a function word or number word, and
    (in lower case only) is neither a listed adjective/verb/adverb nor ends like one (``-able``,
    ``-ful``, ``-ous``, ``-ly``, ``-ed``, ...). Title-cased and upper-cased words are kept, as
    spaCy's tagger marks most of them ``PROPN`` in product titles. Returns lower-cased tokens in
    order, repeats kept (WebShop's list semantics). Pure Python, ~50 us per new title, memoised.
    """

    def __init__(self) -> None:
        self._memo = _Memo(self._extract)
        self._prepared: set[str] = set()

    #: names the on-disk noun tables; changes whenever the lexicon or the rules change
    cache_tag: str = ""  # set below the class, from the lexicon and rules themselves

    @staticmethod
    def _is_noun(token: str) -> bool:
        if token in _SYMBOL_NOUNS:
            return True
        if not _HAS_LETTER.search(token) or _NUMBER.match(token):
            return False
        lower = token.lower()
        if lower in _FUNCTION_WORDS or lower in _NUMBER_WORDS or lower in _CAPITALISED_NON_NOUNS:
            return False
        if token != lower:
            return True
        if lower in _LOWER_NON_NOUNS:
            return False
        if lower.endswith(_NON_NOUN_SUFFIXES) and lower not in _SUFFIX_NOUN_EXCEPTIONS:
            return False
        return True

    def _extract(self, text: str) -> tuple[str, ...]:
        return tuple(token.lower() for token in _tokenize(text) if self._is_noun(token))

    def __call__(self, text: str) -> tuple[str, ...]:
        return self._memo(text)

    def extract_many(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """Nouns of each of ``texts`` (the same interface as :meth:`SpacyNouns.extract_many`)."""
        intern = sys.intern
        return [
            tuple(intern(token.lower()) for token in _tokenize(text) if self._is_noun(token))
            for text in texts
        ]

    def prefetch(self, texts: Iterable[str]) -> None:
        """Extract ``texts`` now into the memo (the same interface as :meth:`SpacyNouns.prefetch`)."""
        for text in texts:
            self._memo(text)

    def prepare(
        self, titles: Sequence[str], digest: str, cache_dir: str | os.PathLike[str] | None = None
    ) -> int:
        """Pin the nouns of every one of ``titles``; see :func:`prepare_title_nouns`."""
        return _prepare(self, titles, digest, cache_dir)

    def __reduce__(self):
        return (type(self), ())

    def __repr__(self) -> str:
        return "FallbackNouns()"


def _fallback_tag() -> str:
    h = hashlib.blake2b(digest_size=6)
    for words in (
        _FUNCTION_WORDS, _NUMBER_WORDS, _LOWER_NON_NOUNS, _CAPITALISED_NON_NOUNS, _SYMBOL_NOUNS,
        _SUFFIX_NOUN_EXCEPTIONS,
    ):  # fmt: skip
        h.update(" ".join(sorted(words)).encode())
        h.update(b"\0")
    for rule in (_PREFIX, _SUFFIX, _INFIX, _HAS_LETTER, _NUMBER):
        h.update(rule.pattern.encode())
    h.update(" ".join(_NON_NOUN_SUFFIXES).encode())
    return f"fallback-{h.hexdigest()}"


FallbackNouns.cache_tag = _fallback_tag()


# ---------------------------------------------------------------------------------------------
# A catalogue's title nouns, computed once and cached on disk.
# ---------------------------------------------------------------------------------------------

_NOUN_TABLE_VERSION = 1


def titles_digest(titles: Iterable[str]) -> str:
    """A digest of ``titles`` in order: names a catalogue's on-disk noun table."""
    h = hashlib.blake2b(digest_size=12)
    for title in titles:
        h.update(title.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _default_cache_dir() -> Path:
    from agentgym.envs.cache import cache_dir

    return cache_dir("webshop")


def _read_table(path: Path, n: int) -> list[tuple[str, ...]] | None:
    try:
        # JSON, not pickle: a cache file is data, and loading it must never run code.
        with open(path, encoding="utf-8") as f:
            version, table = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        return None  # a truncated or foreign file: tag again and overwrite it
    if version != _NOUN_TABLE_VERSION or not isinstance(table, list) or len(table) != n:
        return None
    if not all(isinstance(row, list) and all(isinstance(w, str) for w in row) for row in table):
        return None
    return [tuple(row) for row in table]


def _write_table(path: Path, table: list[tuple[str, ...]]) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # readers see the old file or the whole new one, never a part
        atomic_write_text(path, json.dumps([_NOUN_TABLE_VERSION, table], separators=(",", ":")))
        return True
    except OSError:
        return False


def _prepare(extractor, titles: Sequence[str], digest: str, cache_dir) -> int:
    if digest in extractor._prepared:
        return 0
    path = Path(cache_dir or _default_cache_dir()) / f"nouns-{extractor.cache_tag}-{digest}.json"
    table = _read_table(path, len(titles))
    tagged = 0
    if table is None:
        if len(titles) > 20000:
            print(
                f"agentgym webshop: finding the nouns of {len(titles):,} titles once "
                f"({extractor!r}); cached at {path}",
                file=sys.stderr,
            )
        table = extractor.extract_many(titles)
        tagged = len(titles)
        if not _write_table(path, table):
            print(
                f"agentgym webshop: cannot write {path}; title nouns kept in memory only "
                "(set $AGENTGYM_CACHE to a writable folder to keep them)",
                file=sys.stderr,
            )
    extractor._memo.pin(titles, table)
    extractor._prepared.add(digest)
    return tagged


def prepare_title_nouns(
    extractor: NounExtractor,
    titles: Sequence[str],
    digest: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> int:
    """Compute the nouns of a catalogue's ``titles`` once, so that no step runs the tagger.

    The table is loaded from ``cache_dir`` (default ``$AGENTGYM_CACHE/webshop``) when a file for
    this extractor's :attr:`cache_tag` and these titles exists, else computed in batches and
    written there atomically (kept in memory only when the folder is not writable). A second call
    with the same ``digest`` returns at once. Extractors without ``prepare`` (any callable
    title -> nouns) are left as they are.

    Args:
        extractor: the reward's noun extractor.
        titles: distinct product and goal titles, in a fixed order (the table's order on disk).
        digest: :func:`titles_digest` of ``titles``, if the caller has it already.
        cache_dir: where noun tables live.

    Returns:
        How many titles were tagged now (0 when the table came from memory or disk).
    """
    prepare = getattr(extractor, "prepare", None)
    if prepare is None:
        return 0
    return prepare(titles, digest or titles_digest(titles), cache_dir)


# ---------------------------------------------------------------------------------------------
# One extractor per process.
# ---------------------------------------------------------------------------------------------

_default: NounExtractor | None = None
_default_lock = threading.Lock()


def default_noun_extractor() -> NounExtractor:
    """The process-wide extractor: spaCy's model when it loads, else :class:`FallbackNouns`.

    Tries ``$WEBSHOP_SPACY_MODEL`` (a package name or a model folder) if set, else
    ``en_core_web_sm``. Prints one line on stderr saying which extractor is in use. A set but
    unloadable ``$WEBSHOP_SPACY_MODEL`` also falls back, and the line says why.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = _choose_default()
        return _default


def reset_default_noun_extractor() -> None:
    """Forget the process-wide extractor (the next call chooses again, e.g. after setting
    ``$WEBSHOP_SPACY_MODEL``)."""
    global _default
    with _default_lock:
        _default = None


def _choose_default() -> NounExtractor:
    requested = os.environ.get(MODEL_ENV_VAR, "").strip()
    model = requested or _DEFAULT_MODEL
    try:
        extractor = SpacyNouns(model)
    except (ImportError, OSError, ValueError) as exc:
        reason = "spaCy is not installed" if isinstance(exc, ImportError) else f"{exc}"
        if not requested:
            reason = (
                f"spaCy model {model!r} not installed (python -m spacy download {_DEFAULT_MODEL}"
                f" or set ${MODEL_ENV_VAR})"
                if not isinstance(exc, ImportError)
                else reason
            )
        print(
            f"agentgym webshop: title nouns from FallbackNouns (no model): {reason}",
            file=sys.stderr,
        )
        return FallbackNouns()
    where = f"{model} (${MODEL_ENV_VAR})" if requested else model
    if Path(model).is_dir():
        where = f"folder {where}"
    print(f"agentgym webshop: title nouns from spaCy model {where}", file=sys.stderr)
    return extractor
